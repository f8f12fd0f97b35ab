package lifecycle

import (
	"fmt"
	"sort"
	"testing"
	"time"
)

// BenchmarkJournalPut is one create's "creating" commit, alone: what a
// cold create pays before its backend is asked (the state directory's
// disk decides it). It reports the p50 and p99 of single, unbatched Puts.
func BenchmarkJournalPut(b *testing.B) {
	j, _, err := OpenJournal(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if err := j.Put(journalRecord{ID: fmt.Sprintf("sb-%d", i), State: StateCreating, Owner: "dag/run"}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(a, c int) bool { return lat[a] < lat[c] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50_us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99_us")
}
