package failpoint

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRefusesBadSpecs(t *testing.T) {
	for _, spec := range []string{"=kill", "a=sleep:x", "a=sleep:-1s", "a=after:", "a=explode"} {
		_, err := Parse(spec, nil)
		assert.Error(t, err, spec)
	}
	f, err := Parse("", nil)
	require.NoError(t, err)
	assert.Nil(t, f, "an empty spec arms nothing")
	Hit(f, "anything") // and a nil Func is safe to hit
}

// after orders two goroutines whatever the scheduler does: the waiter's
// code runs only once the other point was reached, even when the waiter
// gets there first.
func TestAfterOrdersPoints(t *testing.T) {
	f, err := Parse("second=after:first", nil)
	require.NoError(t, err)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f("second")
		mu.Lock()
		order = append(order, "second")
		mu.Unlock()
	}()
	time.Sleep(50 * time.Millisecond) // give "second" every chance to run first
	mu.Lock()
	order = append(order, "first")
	mu.Unlock()
	f("first")
	wg.Wait()
	assert.Equal(t, []string{"first", "second"}, order)
}

func TestSleep(t *testing.T) {
	f, err := Parse("nap=sleep:30ms", nil)
	require.NoError(t, err)
	start := time.Now()
	f("nap")
	assert.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
	start = time.Now()
	f("other") // unarmed points go straight on
	assert.Less(t, time.Since(start), 30*time.Millisecond)
}
