package sbx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// File operations run inside the guest: sbx exec -i NAME /bin/sh -c SCRIPT
// with a fixed script, the path as a positional argument (never part of the
// script), file data on stdin (write) or stdout (read). The microVM is the
// security boundary: the daemon never touches the shared workspace on the
// host beyond creating and removing it, so a guest-made symlink cannot lead
// the daemon anywhere. Confining paths to the workdir and /tmp is the
// contract clients see (as for bwrap's and gVisor's writes; their reads take any path of
// the sandbox's view, docs/sbx.md), checked twice: lexically on the host
// ('..', absolute paths elsewhere) and after resolving symlinks in the guest
// (realpath). A guest process racing the script can only make it act on the
// guest's own files, which the guest can reach anyway.
const (
	// maxReadBytes is the most ReadFile transfers, whatever the caller
	// allows: the whole file passes through one sbx exec's stdout.
	maxReadBytes = 1 << 30
	// maxListOutput bounds a listing's output (names are up to 255 bytes).
	maxListOutput = 64 << 20
	// markerSlack is room in stdout for what sbx itself may print before
	// the script's marker (a daemon banner).
	markerSlack = 64 << 10
	// writeTempPrefix names WriteFile's temporary files in the guest.
	writeTempPrefix = ".sidecar-write-"
)

// scriptMarker is the first line every file script prints. What precedes
// it on stdout is not the script's; its absence means the script never ran
// (sbx failed, or the sandbox is gone).
const scriptMarker = "sandbox-sidecar-file-op-7d3f"

// Exit statuses of the file scripts; far from 1 (what sbx exec gives for a
// missing sandbox) and from 124-127.
const (
	codeEscapes     = 80 // the path leads outside the workdir and /tmp
	codeNotFound    = 81
	codeIsDir       = 82
	codeNotDir      = 83
	codeTooLarge    = 84 // the size is on stderr
	codeNotRegular  = 85
	codeTooMany     = 86
	codePermission  = 87
	codeFailed      = 88 // a tool failed; its message is on stderr
	codeNoWorkspace = 89
)

// scriptPrologue is shared by the file scripts. $1 is the workdir; it sets
// W and T to the real paths of the workdir and /tmp, and defines resolve
// (sets R to where a path leads, symlinks resolved, missing components kept;
// exits codeEscapes when that is outside W and T) and missing (exits
// codeNotDir when a component is not a directory, else codeNotFound).
// Command substitution strips trailing newlines, which a name may end with,
// so every substitution appends a '.' that is then cut with the newline.
const scriptPrologue = `printf '%s\n' '` + scriptMarker + `'
W=$(realpath -e -- "$1" && printf .) || exit 89
W=${W%??}
T=$(realpath -e /tmp && printf .) || exit 89
T=${T%??}
shift
resolve() {
	R=$(realpath -m -- "$1" 2>/dev/null && printf .) || exit 80
	R=${R%??}
	case $R in "$W" | "$W"/* | "$T" | "$T"/*) ;; *) exit 80 ;; esac
}
missing() {
	d=$1
	while [ ! -e "$d" ]; do
		d=${d%/*}
		[ -n "$d" ] || d=/
	done
	[ -d "$d" ] || exit 83
	exit 81
}
`

// readScript: $1 path, $2 max bytes. Prints the file, at most max+1 bytes.
const readScript = scriptPrologue + `resolve "$1"
max=$2
[ -e "$R" ] || missing "$R"
[ -d "$R" ] && exit 82
[ -f "$R" ] || exit 85
[ -r "$R" ] || exit 87
size=$(stat -c %s -- "$R") || exit 88
if [ "$size" -gt "$max" ]; then
	printf '%s\n' "$size" >&2
	exit 84
fi
head -c "$((max + 1))" -- "$R" || exit 88
`

// writeScript: $1 parent directory, $2 name, $3 octal mode; data on stdin.
// The parent is resolved and checked before any directory is made, so
// mkdir -p never creates anything outside; the data goes to a temporary
// file renamed over the name, which replaces a symlink there rather than
// writing through it.
const writeScript = scriptPrologue + `resolve "$1"
P=$R
if [ ! -d "$P" ]; then
	[ -e "$P" ] && exit 83
	d=$P
	while [ ! -e "$d" ]; do
		d=${d%/*}
		[ -n "$d" ] || d=/
	done
	[ -d "$d" ] || exit 83
	mkdir -p -- "$P" || exit 88
fi
t=$P/$2
if [ -d "$t" ] && [ ! -L "$t" ]; then exit 82; fi
tmp=$(mktemp -- "$P/` + writeTempPrefix + `XXXXXXXXXX") || exit 88
if cat >"$tmp" && chmod "$3" -- "$tmp" && mv -f -T -- "$tmp" "$t"; then exit 0; fi
rm -f -- "$tmp"
exit 88
`

// listScript: $1 directory, $2 max entries. Prints one record per entry,
// 'd' or 'f' then the name, each ended by NUL (names may hold newlines).
// A symlink is 'f': following it could leave the sandbox.
const listScript = scriptPrologue + `resolve "$1"
max=$2
[ -e "$R" ] || missing "$R"
[ -d "$R" ] || exit 83
cd -- "$R" 2>/dev/null || exit 87
[ -r . ] || exit 87
n=0
for f in .* *; do
	case $f in . | ..) continue ;; esac
	[ -e "$f" ] || [ -L "$f" ] || continue
	n=$((n + 1))
	[ "$n" -le "$max" ] || exit 86
	if [ -d "$f" ] && [ ! -L "$f" ]; then printf 'd%s\0' "$f"; else printf 'f%s\0' "$f"; fi
done
`

// guestPath maps p onto an absolute guest path under workdir or /tmp:
// relative paths start at workdir, '..' is resolved lexically, anything that
// lands elsewhere is refused, as are NUL bytes and the empty path. Symlinks
// are resolved later, in the guest.
func guestPath(workdir, p string) (string, error) {
	confined := fmt.Sprintf("file operations are confined to the sandbox's workdir (%s) and /tmp, and relative paths start at the workdir; use run_command to read other paths", workdir)
	switch {
	case p == "":
		return "", fmt.Errorf("%w: the path is empty; %s", backend.ErrBadPath, confined)
	case strings.IndexByte(p, 0) >= 0:
		return "", fmt.Errorf("%w: the path contains a NUL byte; %s", backend.ErrBadPath, confined)
	case len(p) > backend.MaxGuestPathLen:
		return "", fmt.Errorf("%w: the path is %d bytes long, more than the %d allowed", backend.ErrBadPath, len(p), backend.MaxGuestPathLen)
	}
	clean := p
	if !path.IsAbs(clean) {
		clean = workdir + "/" + clean
	}
	clean = path.Clean(clean)
	for _, root := range []string{workdir, guestTmp} {
		if clean == root || strings.HasPrefix(clean, root+"/") {
			return clean, nil
		}
	}
	return "", fmt.Errorf("%w: %s is outside the sandbox's files; %s", backend.ErrBadPath, backend.ShortName(p), confined)
}

// scriptResult is what a file script left: its stdout after the marker,
// its exit status and its messages.
type scriptResult struct {
	out    []byte
	code   int
	stderr []byte
}

// runScript runs script in sandbox id with args (after the workdir) and
// stdin, keeping up to maxOut bytes of its stdout.
func (b *Backend) runScript(ctx context.Context, id, script string, stdin []byte, maxOut int, args ...string) (scriptResult, error) {
	if err := ctx.Err(); err != nil {
		return scriptResult{}, err
	}
	sb, err := b.lookup(id)
	if err != nil {
		return scriptResult{}, err
	}
	opCtx, done, err := sb.begin(ctx)
	if err != nil {
		return scriptResult{}, err
	}
	defer done()

	switch err := b.ensureRunning(opCtx, sb); {
	case errors.Is(err, errGone):
		return scriptResult{}, vanished(id)
	case err != nil && errors.Is(context.Cause(opCtx), errSandboxDestroyed):
		return scriptResult{}, fmt.Errorf("%w: sandbox %q was destroyed during the file operation; create a new one", backend.ErrNotFound, id)
	case err != nil:
		return scriptResult{}, fmt.Errorf("file operation in sandbox %s did not run: %w", id, err)
	}
	argv := []string{"exec"}
	if len(stdin) > 0 {
		argv = append(argv, "-i")
	}
	argv = append(argv, "-w", sb.workspace(), "--", sb.name, shellPath, "-c", script, "sidecar-file-op", sb.workspace())
	argv = append(argv, args...)
	endSession := sb.session()
	res, runErr := b.runSbx(opCtx, fileOpTimeout, maxOut+markerSlack, stdin, argv...)
	endSession()
	switch {
	case runErr == nil:
	case errors.Is(context.Cause(opCtx), errSandboxDestroyed):
		return scriptResult{}, fmt.Errorf("%w: sandbox %q was destroyed during the file operation; create a new one", backend.ErrNotFound, id)
	case ctx.Err() != nil:
		return scriptResult{}, fmt.Errorf("file operation in sandbox %s was stopped because the request ended: %w", id, ctx.Err())
	default:
		return scriptResult{}, fmt.Errorf("%w: sbx exec could not be started for sandbox %s (%v); check that %s is installed and executable", backend.ErrUnavailable, id, runErr, b.sbx)
	}
	if res.TimedOut {
		return scriptResult{}, fmt.Errorf("%w: a file operation in sandbox %s took longer than %v; the microVM may be overloaded, retry later", backend.ErrUnavailable, id, fileOpTimeout)
	}
	marker := []byte(scriptMarker + "\n")
	i := bytes.Index(res.Stdout, marker)
	if i < 0 {
		// The script never ran: sbx failed, or has no such sandbox.
		if looksLikeMissingSandbox(res) {
			exists, lsErr := b.sbxHas(ctx, sb.name)
			switch {
			case errors.Is(lsErr, errSignedOut), errors.Is(lsErr, errNoPolicy):
				return scriptResult{}, fmt.Errorf("file operation in sandbox %s did not run: %w", id, lsErr)
			case lsErr == nil && !exists:
				return scriptResult{}, vanished(id)
			}
		}
		return scriptResult{}, fmt.Errorf("%w: sbx exec failed in sandbox %s (%s); check the sbx daemon", backend.ErrUnavailable, id, failure(res, nil, fileOpTimeout))
	}
	if res.StdoutTruncated {
		return scriptResult{}, fmt.Errorf("%w: sbx printed more than expected during a file operation in sandbox %s; retry", backend.ErrUnavailable, id)
	}
	return scriptResult{out: res.Stdout[i+len(marker):], code: res.ExitCode, stderr: res.Stderr}, nil
}

// scriptError maps a file script's exit status to the backend's errors.
func scriptError(id, p string, r scriptResult) error {
	name := backend.ShortName(p)
	msg := firstLine(r.stderr)
	switch r.code {
	case codeEscapes:
		return fmt.Errorf("%w: %s leads outside the sandbox's workdir and /tmp (through '..' or a symlink); file operations are confined to those directories; use run_command to read other paths", backend.ErrBadPath, name)
	case codeNotFound:
		return fmt.Errorf("%w: %s does not exist in the sandbox; list its directory to see what is there", backend.ErrPathNotFound, name)
	case codeIsDir:
		return fmt.Errorf("%w: %s is a directory; give a file path, or list the directory", backend.ErrIsDirectory, name)
	case codeNotDir:
		return fmt.Errorf("%w: %s, or a component of it, is not a directory", backend.ErrNotDirectory, name)
	case codeNotRegular:
		return fmt.Errorf("%w: %s is not a regular file (a FIFO, socket or device); use run_command for it", backend.ErrBadPath, name)
	case codePermission:
		return fmt.Errorf("%w: permission denied on %s (the guest may have changed its mode); fix it with run_command (chmod)", backend.ErrBadPath, name)
	case codeNoWorkspace:
		return fmt.Errorf("%w: the workdir of sandbox %s is missing inside its microVM; destroy it and create a new one", backend.ErrNotFound, id)
	case codeFailed:
		switch lower := strings.ToLower(msg); {
		case strings.Contains(lower, "permission denied"), strings.Contains(lower, "read-only file system"):
			return fmt.Errorf("%w: permission denied on %s (%s); fix the modes with run_command (chmod)", backend.ErrBadPath, name, msg)
		case strings.Contains(lower, "no space left"), strings.Contains(lower, "quota"):
			return fmt.Errorf("no space left for %s in sandbox %s; delete files in the sandbox and retry (%s)", name, id, msg)
		}
		return fmt.Errorf("file operation on %s in sandbox %s failed: %s", name, id, msg)
	}
	if msg == "" {
		msg = "no message"
	}
	return fmt.Errorf("file operation on %s in sandbox %s failed with exit status %d (%s)", name, id, r.code, msg)
}

// workdirOf returns the workdir of sandbox id as its guest sees it.
func (b *Backend) workdirOf(id string) (string, error) {
	sb, err := b.lookup(id)
	if err != nil {
		return "", err
	}
	return sb.workspace(), nil
}

// ReadFile returns the regular file at p. The guest checks its size before
// sending anything and never sends more than maxBytes+1 bytes; the host
// checks again, so a file growing meanwhile still returns
// *backend.FileTooLargeError. FIFOs, sockets and devices are refused.
// maxBytes above 1 GiB is treated as 1 GiB.
func (b *Backend) ReadFile(ctx context.Context, id, p string, maxBytes int64) ([]byte, error) {
	if maxBytes < 0 {
		return nil, fmt.Errorf("%w: maxBytes %d is negative", backend.ErrInvalidArgument, maxBytes)
	}
	workdir, err := b.workdirOf(id)
	if err != nil {
		return nil, err
	}
	gp, err := guestPath(workdir, p)
	if err != nil {
		return nil, err
	}
	limit := min(maxBytes, maxReadBytes)
	r, err := b.runScript(ctx, id, readScript, nil, int(limit)+1, gp, strconv.FormatInt(limit, 10))
	if err != nil {
		return nil, err
	}
	switch r.code {
	case 0:
	case codeTooLarge:
		size, convErr := strconv.ParseInt(firstLine(r.stderr), 10, 64)
		if convErr != nil {
			size = limit + 1
		}
		return nil, &backend.FileTooLargeError{Path: p, Size: size, MaxBytes: limit}
	default:
		return nil, scriptError(id, p, r)
	}
	if int64(len(r.out)) > limit {
		// It grew between the guest's stat and its read: all that is known
		// is that it is larger than allowed.
		return nil, &backend.FileTooLargeError{Path: p, Size: int64(len(r.out)), MaxBytes: limit}
	}
	return r.out, nil
}

// WriteFile writes data to p, creating missing parent directories. The data
// goes to a temporary file in the same directory that is then renamed over
// p, so a symlink at p is replaced, never written through, and a reader never
// sees half a file. mode 0 means 0644; only permission bits are used.
func (b *Backend) WriteFile(ctx context.Context, id, p string, data []byte, mode os.FileMode) error {
	workdir, err := b.workdirOf(id)
	if err != nil {
		return err
	}
	gp, err := guestPath(workdir, p)
	if err != nil {
		return err
	}
	if gp == workdir || gp == guestTmp {
		return fmt.Errorf("%w: %s is a directory; give a file path", backend.ErrIsDirectory, backend.ShortName(p))
	}
	if mode == 0 {
		mode = 0o644
	}
	mode &= os.ModePerm
	r, err := b.runScript(ctx, id, writeScript, data, 0, path.Dir(gp), path.Base(gp), strconv.FormatUint(uint64(mode), 8))
	if err != nil {
		return err
	}
	if r.code != 0 {
		return scriptError(id, p, r)
	}
	return nil
}

// ListDirectory lists the directory at p, sorted by name. A symlink is
// reported as not a directory. More than maxEntries entries returns
// ErrTooManyEntries; the guest stops after maxEntries+1.
func (b *Backend) ListDirectory(ctx context.Context, id, p string, maxEntries int) ([]backend.DirEntry, error) {
	if maxEntries <= 0 {
		return nil, fmt.Errorf("%w: maxEntries must be positive, got %d", backend.ErrInvalidArgument, maxEntries)
	}
	workdir, err := b.workdirOf(id)
	if err != nil {
		return nil, err
	}
	gp, err := guestPath(workdir, p)
	if err != nil {
		return nil, err
	}
	budget := min(int64(maxEntries)+1, maxListOutput/258) * 258 // 'd', 255 bytes, NUL, with room
	r, err := b.runScript(ctx, id, listScript, nil, int(budget), gp, strconv.Itoa(maxEntries))
	if err != nil {
		return nil, err
	}
	switch r.code {
	case 0:
	case codeTooMany:
		return nil, fmt.Errorf("%w: %s has more than %d entries; list a subdirectory, or use run_command with find or ls | head", backend.ErrTooManyEntries, backend.ShortName(p), maxEntries)
	default:
		return nil, scriptError(id, p, r)
	}
	entries, err := parseListing(r.out)
	if err != nil {
		return nil, fmt.Errorf("list %s in sandbox %s: %w", backend.ShortName(p), id, err)
	}
	if len(entries) > maxEntries {
		return nil, fmt.Errorf("%w: %s has more than %d entries; list a subdirectory", backend.ErrTooManyEntries, backend.ShortName(p), maxEntries)
	}
	return entries, nil
}

// parseListing reads listScript's records, sorted by name.
func parseListing(out []byte) ([]backend.DirEntry, error) {
	var entries []backend.DirEntry
	for len(out) > 0 {
		i := bytes.IndexByte(out, 0)
		if i < 0 {
			return nil, errors.New("the listing was cut short; retry")
		}
		rec := out[:i]
		out = out[i+1:]
		if len(rec) < 2 || (rec[0] != 'd' && rec[0] != 'f') {
			return nil, fmt.Errorf("the listing holds a malformed record %q", rec[:min(len(rec), 40)])
		}
		entries = append(entries, backend.DirEntry{Name: string(rec[1:]), IsDir: rec[0] == 'd'})
	}
	slices.SortFunc(entries, func(a, b backend.DirEntry) int { return strings.Compare(a.Name, b.Name) })
	return entries, nil
}
