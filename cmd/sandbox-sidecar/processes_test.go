package main

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ps shows a process's argv as a line a shell would run the same way.
func TestCommandLine(t *testing.T) {
	for _, c := range []struct {
		command string
		argv    []string
		want    string
	}{
		{"echo a; echo b", nil, "echo a; echo b"},
		{"printf 'x'\necho y", nil, `printf 'x'\necho y`},
		{"", []string{"python3", "-m", "http.server", "--bind=127.0.0.1"}, "python3 -m http.server --bind=127.0.0.1"},
		{"", []string{"sh", "-c", "echo it's $HOME"}, `sh -c 'echo it'\''s $HOME'`},
		{"", []string{"printf", ""}, "printf ''"},
	} {
		assert.Equal(t, c.want, commandLine(c.command, c.argv))
	}
}

// Flags may come before, between or after the positional arguments.
func TestParsePositional(t *testing.T) {
	for _, args := range [][]string{
		{"-f", "--from", "7", "sc-1", "p-1"},
		{"sc-1", "p-1", "-f", "--from", "7"},
		{"sc-1", "-f", "p-1", "--from=7"},
	} {
		fs := flag.NewFlagSet("logs", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		follow := fs.Bool("f", false, "")
		from := fs.Int64("from", 0, "")
		pos, err := parsePositional(fs, args, "SANDBOX", "PROCESS")
		require.NoError(t, err, "%q", args)
		assert.Equal(t, []string{"sc-1", "p-1"}, pos, "%q", args)
		assert.True(t, *follow)
		assert.EqualValues(t, 7, *from)
	}
	fs := flag.NewFlagSet("logs", flag.ContinueOnError)
	_, err := parsePositional(fs, []string{"sc-1"}, "SANDBOX", "PROCESS")
	var ee *exitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 2, ee.code)
	assert.EqualError(t, err, "want SANDBOX PROCESS")
}
