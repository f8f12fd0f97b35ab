package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// step is one line of an agent's code record, as the ledger takes it in;
// bad says the judge must find a violation there.
type step struct {
	op  string // sent, got, restart, restarted
	v   int
	bad bool
}

func replay(t *testing.T, tolerateLoss bool, steps ...step) {
	t.Helper()
	l := &codeLedger{tolerateLoss: tolerateLoss}
	for i, s := range steps {
		switch s.op {
		case "sent":
			l.sent()
		case "restart":
			l.restartSent()
		case "restarted":
			l.restarted()
		case "got":
			why := l.judge(s.v)
			assert.Equal(t, s.bad, why != "", "step %d (got %d): %q", i, s.v, why)
		}
	}
}

func sent() step        { return step{op: "sent"} }
func got(v int) step    { return step{op: "got", v: v} }
func lostAt(v int) step { return step{op: "got", v: v, bad: true} }

func TestCodeLedgerJudgesTheCount(t *testing.T) {
	t.Run("answered in order", func(t *testing.T) {
		replay(t, false, sent(), got(1), sent(), got(2), sent(), got(3))
	})
	t.Run("state lost", func(t *testing.T) {
		replay(t, false, sent(), got(1), sent(), got(2), sent(), lostAt(1))
	})
	t.Run("a cell ran twice", func(t *testing.T) {
		replay(t, false, sent(), got(1), sent(), lostAt(3))
	})
	t.Run("a cell without an answer may have run", func(t *testing.T) {
		replay(t, false, sent(), got(1), sent(), sent(), got(3))
		replay(t, false, sent(), got(1), sent(), sent(), got(2))
	})
	t.Run("or run later, once", func(t *testing.T) {
		// The unanswered cell did not run before the next one (2), runs
		// after it (3), and cannot run again.
		replay(t, false, sent(), got(1), sent(), sent(), got(2), sent(), got(4), sent(), lostAt(6))
	})
	t.Run("a restart starts the count again", func(t *testing.T) {
		replay(t, false, sent(), got(1), sent(), got(2), step{op: "restart"}, step{op: "restarted"}, sent(), got(1))
		replay(t, false, sent(), got(1), sent(), got(2), step{op: "restart"}, step{op: "restarted"}, sent(), lostAt(3))
	})
	t.Run("a restart without an answer may or may not have happened", func(t *testing.T) {
		replay(t, false, sent(), got(1), sent(), got(2), step{op: "restart"}, sent(), got(1))
		replay(t, false, sent(), got(1), sent(), got(2), step{op: "restart"}, sent(), got(3))
		replay(t, false, sent(), got(1), sent(), got(2), step{op: "restart"}, sent(), got(3), sent(), lostAt(1))
	})
	t.Run("loss tolerated without process survival", func(t *testing.T) {
		replay(t, true, sent(), got(1), sent(), got(2), sent(), got(1))
		replay(t, true, sent(), got(1), sent(), lostAt(3))
	})
	t.Run("and counted", func(t *testing.T) {
		l := &codeLedger{tolerateLoss: true}
		for _, v := range []int{1, 2, 1, 2} {
			l.sent()
			require.Empty(t, l.judge(v))
		}
		assert.Equal(t, 1, l.tolerated)
	})
}

func TestCodeLedgerReplaysItsRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "code-0")
	l, err := readCodeLedger(path, false)
	require.NoError(t, err, "no record yet is a fresh ledger")
	assert.Equal(t, codeLedger{}, *l)
	require.NoError(t, os.WriteFile(path, []byte("sent\ngot 1\nsent\ngot 2\nrestart\nrestarted\nsent\nsent\ngot 1\ninterrupted\nsent\n"), 0o644))
	l, err = readCodeLedger(path, false)
	require.NoError(t, err)
	assert.Equal(t, 1, l.last)
	assert.Equal(t, 2, l.pending, "one cell unanswered before the last answer, one after")
	assert.Equal(t, 3, l.answered)
	assert.Equal(t, 1, l.restarts)
	assert.Equal(t, 1, l.interrupted)
	l.sent()
	assert.Empty(t, l.judge(3), "the next answer may count both cells sent without one")

	require.NoError(t, os.WriteFile(path, []byte("got x\n"), 0o644))
	_, err = readCodeLedger(path, false)
	assert.Error(t, err, "a garbled record")
}
