package service

// What the ops with large results reserve of the connection's and the
// daemon's response budgets (ipc.Request.ReserveResponse) before they make
// their result, so that a client that asks for many and reads none cannot
// make the daemon hold them all. Each bound counts the data and as much
// again for its encoding, plus the envelope.
const responseOverhead = 64 << 10

// readFileReservation: the file's bytes, then their encoding.
func readFileReservation(maxBytes int64) int64 { return 2*maxBytes + responseOverhead }

// runCommandReservation: per stream, the capture buffer, the copy the
// result carries, and its encoding. It is held while the command runs.
func runCommandReservation(maxOutputBytes int) int64 {
	return 3*2*int64(maxOutputBytes) + responseOverhead
}

// listDirectoryReservation: per entry, the backend's entry and the
// result's map (a name of up to 255 bytes each), and its encoding.
func listDirectoryReservation(maxEntries int) int64 { return int64(maxEntries)<<10 + responseOverhead }

// LargestReservation is the most one request of these limits reserves: a
// connection's response budget must hold at least this much.
func LargestReservation(l Limits) int64 {
	l.setDefaults()
	return max(readFileReservation(l.MaxFileBytes), runCommandReservation(l.MaxOutputBytes)+streamWindowBytes, listDirectoryReservation(l.MaxListEntries))
}
