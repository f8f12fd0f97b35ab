package api

// PauseResult is pause's and resume's result: the sandbox as the op left
// it.
type PauseResult struct {
	Sandbox string `msgpack:"sandbox"`
	// State is "paused" after a pause, "ready" after a resume.
	State string `msgpack:"state"`
	// PausedAt is when the sandbox was paused (while it is).
	PausedAt float64 `msgpack:"paused_at,omitempty"`
	// MemoryReleased says the pause gave the sandbox's memory back to the
	// host (a checkpoint on disk), not only its CPU; false on bwrap.
	MemoryReleased bool `msgpack:"memory_released"`
	// ExpiresAt and RemainingS: a paused sandbox still ends at its lease.
	ExpiresAt  float64 `msgpack:"expires_at"`
	RemainingS float64 `msgpack:"remaining_s"`
}

// The pause ops' types join Results and Requests here, beside their own
// types, rather than in the tables above.
func init() {
	Results["pause"], Results["resume"] = PauseResult{}, PauseResult{}
	Requests["pause"], Requests["resume"] = SandboxRequest{}, SandboxRequest{}
}
