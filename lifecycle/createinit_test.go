package lifecycle

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A cold create's sandbox has its init running before any command (bwrap's
// Create begins the start and the lifecycle does nothing for it), and the
// first command runs in that init. The backend's own tests force the
// orders: a command, a destroy or a close during the start, a failed one
// (backend/bwrap, start_test.go).
func TestBwrapColdCreateStartsItsInitBeforeTheFirstCommand(t *testing.T) {
	e := newEnv(t, withBwrap())
	s := e.create(alice, CreateRequest{TTL: time.Hour})
	require.Eventually(t, func() bool { return sandboxInit(s.ID) != 0 }, 20*time.Second, 5*time.Millisecond,
		"the init runs with no command yet")
	before := sandboxInit(s.ID)
	res := e.exec(alice, s.ID, "cat /proc/1/comm")
	assert.Equal(t, "sandbox-init\n", string(res.Stdout))
	assert.Equal(t, before, sandboxInit(s.ID), "the first command ran in the init the create started")
}
