package sbx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/capture"
)

// MinVersion is the oldest sbx the backend runs on: the oldest release in
// which everything it uses unconditionally is there (docs/sbx.md has the
// table): version --json (v0.42), a 512 MiB microVM (v0.43), create
// --deny-network and --pull, policy init, check and ls --source.
var MinVersion = sbxVersion{0, 43, 0}

// versionTimeout bounds sbx version at start.
const versionTimeout = 30 * time.Second

// sbxVersion is a release number, major.minor.patch.
type sbxVersion struct{ Major, Minor, Patch int }

func (v sbxVersion) String() string { return fmt.Sprintf("v%d.%d.%d", v.Major, v.Minor, v.Patch) }

func (v sbxVersion) less(o sbxVersion) bool {
	if v.Major != o.Major {
		return v.Major < o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor < o.Minor
	}
	return v.Patch < o.Patch
}

var versionPattern = regexp.MustCompile(`^v?(\d{1,6})\.(\d{1,6})\.(\d{1,6})(?:[-+][0-9A-Za-z.+-]*)?$`)

func parseVersion(s string) (sbxVersion, bool) {
	m := versionPattern.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return sbxVersion{}, false
	}
	var v sbxVersion
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	v.Patch, _ = strconv.Atoi(m[3])
	return v, true
}

// textVersion finds sbx's version in its text output ("sbx version:
// v0.33.0 d7da69cb..."): the first word that is a release number with
// its leading v.
var textVersion = regexp.MustCompile(`(?:^|\s)(v\d{1,6}\.\d{1,6}\.\d{1,6}(?:-[0-9A-Za-z.-]+)?)(?:\s|$)`)

// versionFromOutput reads the version from sbx version --json. The
// reference does not document the JSON's fields, so it is read
// defensively: whatever precedes the JSON is skipped, a field named
// "version" (at any depth, case aside) holding a release number is
// preferred, then any other string value "vX.Y.Z", then a "vX.Y.Z" word
// of the text.
func versionFromOutput(out []byte) (sbxVersion, bool) {
	if i := bytes.IndexByte(out, '{'); i >= 0 {
		var doc any
		if json.NewDecoder(bytes.NewReader(out[i:])).Decode(&doc) == nil {
			var named, other []string
			collectStrings(doc, "", &named, &other)
			slices.Sort(named)
			slices.Sort(other)
			for _, s := range named {
				if v, ok := parseVersion(s); ok {
					return v, true
				}
			}
			for _, s := range other {
				if v, ok := parseVersion(s); ok && strings.HasPrefix(s, "v") {
					return v, true
				}
			}
		}
	}
	if m := textVersion.FindSubmatch(out); m != nil {
		return parseVersion(string(m[1]))
	}
	return sbxVersion{}, false
}

// collectStrings walks a decoded JSON value, putting string values under
// a key named "version" in named and every other string value in other.
func collectStrings(v any, key string, named, other *[]string) {
	switch x := v.(type) {
	case string:
		if strings.EqualFold(key, "version") {
			*named = append(*named, x)
		} else {
			*other = append(*other, x)
		}
	case map[string]any:
		for k, e := range x {
			collectStrings(e, k, named, other)
		}
	case []any:
		for _, e := range x {
			collectStrings(e, key, named, other)
		}
	}
}

// isUnknownFlag reports whether sbx refused a flag it does not have.
func isUnknownFlag(res capture.Result, flag string) bool {
	out := strings.ToLower(string(res.Stderr) + string(res.Stdout))
	return res.ExitCode != 0 && strings.Contains(out, "unknown flag") && strings.Contains(out, flag)
}

// checkVersion asks sbx for its version (sbx version --json), refuses one
// older than MinVersion, and learns whether sbx takes the global
// --no-input, which makes a command that would prompt (an expired login,
// a policy never initialised) fail at once instead of waiting for an
// answer nobody gives: it is passed on every call when it does.
func (b *Backend) checkVersion(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	res, err := b.runSbx(ctx, versionTimeout, cliOutputBytes, nil, "--no-input", "version", "--json")
	b.noInput = err == nil && !res.TimedOut && res.ExitCode == 0
	if err == nil && !res.TimedOut && isUnknownFlag(res, "--no-input") {
		res, err = b.runSbx(ctx, versionTimeout, cliOutputBytes, nil, "version", "--json")
	}
	switch {
	case err != nil:
		return fmt.Errorf("%w: cannot run %s version: %v; %s", backend.ErrUnavailable, b.sbx, err, installHint)
	case res.TimedOut:
		return fmt.Errorf("%w: sbx version did not answer within %v; check that %s is Docker's sbx and works (sbx diagnose)", backend.ErrUnavailable, versionTimeout, b.sbx)
	case isUnknownFlag(res, "--json"):
		return fmt.Errorf("%w: this sbx has no \"version --json\" (added in v0.42.0), so it is older than %s, the oldest sbx this backend knows (docs/sbx.md); upgrade sbx", backend.ErrUnavailable, MinVersion)
	case res.ExitCode != 0:
		return fmt.Errorf("%w: sbx version --json failed (%s); check that %s is Docker's sbx (sbx diagnose)", backend.ErrUnavailable, failure(res, nil, versionTimeout), b.sbx)
	}
	v, ok := versionFromOutput(res.Stdout)
	if !ok {
		return fmt.Errorf("%w: cannot read a version in what sbx version --json printed (%s); check that %s is Docker's sbx", backend.ErrUnavailable, backend.ShortName(firstLine(res.Stdout)), b.sbx)
	}
	if v.less(MinVersion) {
		return fmt.Errorf("%w: sbx %s is older than %s, the oldest sbx this backend knows (what it relies on is listed by version in docs/sbx.md); upgrade sbx", backend.ErrUnavailable, v, MinVersion)
	}
	b.version = v
	return nil
}

// What sbx prints when it needs something only an operator can give: a
// sign-in, an initialised network policy. With --no-input it fails at
// once naming the command to run; without, it would wait for an answer.
var (
	errSignedOut = errors.New("sbx needs `sbx login`: it is not signed in to Docker (the login of the daemon's user expired or was never made), so it runs no sandboxes; sign in as the daemon's user without a browser, with a Docker personal access token on stdin: sudo -u sandbox-sidecar -H sbx login --username <docker-id> --password-stdin (docs/sbx.md)")
	errNoPolicy  = errors.New("sbx needs `sbx policy init`: its global network policy was never chosen, so it runs no sandboxes; run sudo -u sandbox-sidecar -H sbx policy init deny-all and declare it (docs/sbx.md)")
)

// operatorNeeded reports what an sbx command that failed needs from an
// operator (wrapping backend.ErrUnavailable), or nil. Only for sbx's own
// commands: a command run in a sandbox may print anything.
func operatorNeeded(res capture.Result) error {
	if res.ExitCode == 0 || res.TimedOut {
		return nil
	}
	out := strings.ToLower(string(res.Stderr) + "\n" + string(res.Stdout))
	switch {
	case strings.Contains(out, "sbx login"):
		return fmt.Errorf("%w: %w", backend.ErrUnavailable, errSignedOut)
	case strings.Contains(out, "sbx policy init"):
		return fmt.Errorf("%w: %w", backend.ErrUnavailable, errNoPolicy)
	}
	return nil
}
