// Package ipc is the sidecar's wire: length-prefixed msgpack frames over a
// Unix socket, the request/response envelope, the names of ops and error
// codes, peer credentials from the kernel (SO_PEERCRED), connection limits,
// the server loop and the Go client.
//
// ipc knows nothing of sandboxes: it hands each decoded request to a Handler
// and writes back what the Handler returns. It never imports lifecycle or
// backend. docs/protocol.md is the public statement of what this package
// speaks; keep the two in step.
package ipc
