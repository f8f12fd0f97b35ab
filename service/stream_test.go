package service

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

func TestOutputStreamCountsWhatItCannotSend(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail error
	}{
		{"no room for one event", ipc.ErrEventDropped},
		{"connection gone", errors.New("broken pipe")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var sent int64
			calls := 0
			o := startStream(context.Background(), func(event string, data []byte) error {
				mu.Lock()
				defer mu.Unlock()
				calls++
				if calls == 1 {
					return tc.fail
				}
				sent += int64(len(data))
				return nil
			})
			var total int64
			for i := range 50 {
				p := make([]byte, 1000+i)
				o.output(i%2 == 1, p)
				total += int64(len(p))
			}
			out, errb := o.finish()
			mu.Lock()
			defer mu.Unlock()
			if sent+out+errb != total {
				t.Errorf("sent %d + dropped %d+%d != written %d", sent, out, errb, total)
			}
			if tc.fail == ipc.ErrEventDropped && calls < 2 {
				t.Errorf("the stream stopped after one event found no room (%d calls)", calls)
			}
			if tc.fail != ipc.ErrEventDropped && sent != 0 {
				t.Errorf("sent %d bytes after the connection was gone", sent)
			}
		})
	}
}
