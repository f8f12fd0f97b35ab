package sbx

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// A command's environment goes to sbx exec in a file (--env-file), never
// as -e K=V arguments: the arguments of a host process are readable by
// every local user (ps, /proc/PID/cmdline), and an env often carries a
// DAG's credentials. The file is the daemon's alone (mode 0600 in the
// sandbox's state directory, which is 0700 and outside the workspace sbx
// mounts) and removed when sbx exec has returned.
//
// sbx reads the file as Docker's CLI reads --env-file: one NAME=value per
// line, leading whitespace trimmed, blank lines and lines starting with #
// skipped, a line without '=' taken from sbx's own environment, invalid
// UTF-8 and whitespace in a name refused, lines read with a 64 KiB buffer.
// Whatever that format cannot carry exactly is refused (checkEnvFile) rather
// than changed on the way.

// maxEnvFileLine is the longest NAME=value line sbx's reader takes
// (bufio.MaxScanTokenSize, the newline included).
const maxEnvFileLine = bufio.MaxScanTokenSize - 1

// checkEnvFile refuses an environment that an env file cannot carry exactly:
// a newline or carriage return anywhere, invalid UTF-8, a name with
// whitespace or starting with '#' (a comment) or a byte-order mark, a
// line over 64 KiB. It wraps backend.ErrInvalidArgument (bad_request).
func checkEnvFile(env map[string]string, whose string) error {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the same variable named first every time
	for _, k := range keys {
		if err := checkEnvEntry(k, env[k], whose); err != nil {
			return err
		}
	}
	return nil
}

func checkEnvEntry(k, v, whose string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: %s environment variable %s %s, which the sbx backend cannot pass to sbx exec (it passes the environment in an env file, one variable per line); put the value in a file with write_file instead", backend.ErrInvalidArgument, whose, backend.ShortName(k), why)
	}
	switch {
	case strings.ContainsAny(k, "\n\r") || strings.ContainsAny(v, "\n\r"):
		return bad("has a newline or carriage return")
	case !utf8.ValidString(k) || !utf8.ValidString(v):
		return bad("is not valid UTF-8")
	case strings.IndexFunc(k, unicode.IsSpace) >= 0:
		return bad("has whitespace in its name")
	case strings.HasPrefix(k, "#") || strings.HasPrefix(k, "\ufeff"):
		return bad("has a name starting with '#' or a byte-order mark")
	case len(k)+1+len(v) > maxEnvFileLine:
		return bad(fmt.Sprintf("is %d bytes, more than the %d a line of an env file may be", len(k)+1+len(v), maxEnvFileLine))
	}
	return nil
}

// writeEnvFile writes env (NAME=value entries, already checked) to a new
// file in dir that only the daemon's user can read, and returns its path;
// the caller removes it.
func writeEnvFile(dir string, env []string) (string, error) {
	f, err := os.CreateTemp(dir, ".exec-env-*") // mode 0600
	if err != nil {
		return "", fmt.Errorf("%w: cannot write the command's environment file in %s: %v", backend.ErrUnavailable, dir, err)
	}
	path := f.Name()
	w := bufio.NewWriter(f)
	for _, kv := range env {
		w.WriteString(kv)
		w.WriteByte('\n')
	}
	err = w.Flush()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return "", fmt.Errorf("%w: cannot write the command's environment file %s: %v", backend.ErrUnavailable, path, err)
	}
	return path, nil
}

// CheckEnv implements backend.EnvChecker: a create the lifecycle serves
// from the warm pool never reaches Create, so its env is checked here.
func (b *Backend) CheckEnv(env map[string]string) error {
	return checkEnvFile(env, "the sandbox's")
}
