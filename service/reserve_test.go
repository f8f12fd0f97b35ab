package service

import "testing"

// A cell at its cap reserves no more than a command at its own, so a
// configuration whose connection budget holds a command's response holds
// a cell's: adding run_code refused no configuration that worked before.
func TestCellReservesNoMoreThanACommand(t *testing.T) {
	for _, m := range []int{1, 10, 4 << 10, 1 << 20, 4 << 20, 64 << 20, 1 << 30} {
		if code, cmd := runCodeReservation(codeOutputCap(m)), runCommandReservation(m); code > cmd {
			t.Errorf("max_output_bytes %d: a cell reserves %d, a command %d", m, code, cmd)
		}
	}
	if LargestReservation(Limits{}) != max(readFileReservation(DefaultMaxFileBytes), runCommandReservation(DefaultMaxOutputBytes)+streamWindowBytes) {
		t.Error("the largest reservation is not a read_file's or a streamed command's")
	}
}
