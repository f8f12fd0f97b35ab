package lifecycle

import "testing"

// TestBwrapManager runs the manager's tests that touch the backend most
// (commands, files, destroys under a command, recovery after a crash,
// failed destroys, the pool, resources) again on the real bwrap backend:
// the rest of the package runs them on the host test backend, which needs
// no bubblewrap. It skips without bubblewrap, and fails under CI=true.
func TestBwrapManager(t *testing.T) {
	requireBwrap(t)
	onBwrap = true
	defer func() { onBwrap = false }()
	for name, test := range map[string]func(*testing.T){
		"CreateKinds":                       TestCreateKinds,
		"ExecOneAtATimePerSandbox":          TestExecOneAtATimePerSandbox,
		"ExecDestroyedDuringCommand":        TestExecDestroyedDuringCommand,
		"ExecReapedDuringCommand":           TestExecReapedDuringCommand,
		"FileOpsThroughManager":             TestFileOpsThroughManager,
		"RecoverAfterCrash":                 TestRecoverAfterCrash,
		"CrashAtFailpoints":                 TestCrashAtFailpoints,
		"DestroyRetriedWithBackoff":         TestDestroyRetriedWithBackoff,
		"PoolServesCreatesAndRefills":       TestPoolServesCreatesAndRefills,
		"ResourcesAreJournaledAndReadopted": TestResourcesAreJournaledAndReadopted,
	} {
		t.Run(name, test)
	}
}
