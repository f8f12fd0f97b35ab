// Package service is the thin adapter between the wire and the domain: it
// implements ipc.Handler by validating each op's arguments, asking the
// lifecycle.Manager, and turning domain errors into the protocol's stable
// error codes. It also holds the connection policy (who may connect, who is
// an admin) and writes the audit trail: one structured line per request.
//
// It is the only package that imports both ipc and lifecycle, so that
// neither has to know the other.
package service
