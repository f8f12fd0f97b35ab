package sbx

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

var _ backend.RangedFiles = (*Backend)(nil)

// codePastEnd: WriteFileAt's offset lies past the end (the size is on stderr).
const codePastEnd = 90

// maxRangeBytes bounds one ReadFileRange, whatever the caller asks: the
// piece passes through one sbx exec's stdout and the daemon's memory.
const maxRangeBytes = 64 << 20

// readRangeScript: $1 path, $2 offset, $3 length. Prints the file's size on
// a line, then at most length bytes from offset.
const readRangeScript = scriptPrologue + `resolve "$1"
[ -e "$R" ] || missing "$R"
[ -d "$R" ] && exit 82
[ -f "$R" ] || exit 85
[ -r "$R" ] || exit 87
size=$(stat -c %s -- "$R") || exit 88
printf '%s\n' "$size"
[ "$3" -gt 0 ] || exit 0
dd if="$R" bs=65536 iflag=skip_bytes,count_bytes skip="$2" count="$3" status=none || exit 88
`

// writeAtScript: $1 path, $2 offset (-1: the end); data on stdin. The file
// must exist and be regular; a symlink at $1 itself is refused rather than
// written through. Prints the size after the write.
const writeAtScript = scriptPrologue + `resolve "$1"
[ -L "$1" ] && exit 85
[ -e "$R" ] || missing "$R"
[ -d "$R" ] && exit 82
[ -f "$R" ] || exit 85
[ -w "$R" ] || exit 87
size=$(stat -c %s -- "$R") || exit 88
off=$2
[ "$off" -ge 0 ] || off=$size
if [ "$off" -gt "$size" ]; then
	printf '%s\n' "$size" >&2
	exit 90
fi
dd of="$R" bs=65536 oflag=seek_bytes seek="$off" conv=notrunc status=none || exit 88
stat -c %s -- "$R" || exit 88
`

// ReadFileRange implements backend.RangedFiles. length above 64 MiB is
// treated as 64 MiB.
func (b *Backend) ReadFileRange(ctx context.Context, id, p string, offset, length int64) ([]byte, int64, error) {
	if offset < 0 || length < 0 {
		return nil, 0, fmt.Errorf("%w: offset %d and length %d must not be negative", backend.ErrInvalidArgument, offset, length)
	}
	workdir, err := b.workdirOf(id)
	if err != nil {
		return nil, 0, err
	}
	gp, err := guestPath(workdir, p)
	if err != nil {
		return nil, 0, err
	}
	length = min(length, maxRangeBytes)
	r, err := b.runScript(ctx, id, readRangeScript, nil, int(length)+32, gp, strconv.FormatInt(offset, 10), strconv.FormatInt(length, 10))
	if err != nil {
		return nil, 0, err
	}
	if r.code != 0 {
		return nil, 0, scriptError(id, p, r)
	}
	line, data, ok := bytes.Cut(r.out, []byte("\n"))
	size, convErr := strconv.ParseInt(string(line), 10, 64)
	if !ok || convErr != nil || size < 0 {
		return nil, 0, fmt.Errorf("%w: the guest's answer to a ranged read of %s in sandbox %s is malformed; retry", backend.ErrUnavailable, backend.ShortName(p), id)
	}
	if int64(len(data)) > length {
		data = data[:length]
	}
	return data, size, nil
}

// WriteFileAt implements backend.RangedFiles.
func (b *Backend) WriteFileAt(ctx context.Context, id, p string, data []byte, offset int64) (int64, error) {
	workdir, err := b.workdirOf(id)
	if err != nil {
		return 0, err
	}
	gp, err := guestPath(workdir, p)
	if err != nil {
		return 0, err
	}
	if offset < 0 {
		offset = -1
	}
	// Without data sbx exec gets no -i and dd reads nothing: a no-op
	// write that still reports the size.
	r, err := b.runScript(ctx, id, writeAtScript, data, 32, gp, strconv.FormatInt(offset, 10))
	if err != nil {
		return 0, err
	}
	switch r.code {
	case 0:
	case codePastEnd:
		return 0, fmt.Errorf("%w: offset %d is past the end of %s (%s bytes); write from 0 up to its size", backend.ErrInvalidArgument, offset, backend.ShortName(p), firstLine(r.stderr))
	default:
		return 0, scriptError(id, p, r)
	}
	size, convErr := strconv.ParseInt(string(bytes.TrimSpace(r.out)), 10, 64)
	if convErr != nil {
		return 0, fmt.Errorf("%w: the guest's answer to a write of %s in sandbox %s is malformed; retry", backend.ErrUnavailable, backend.ShortName(p), id)
	}
	return size, nil
}
