// Package initexe is what the daemon checks of a sandbox's init
// executable before it hands it to the sandboxes: whether it is static.
// It is apart from initproc, which the init itself links, so that the init
// does not carry an ELF reader (debug/elf and its decompressors) it never
// runs.
package initexe

import (
	"debug/elf"
	"fmt"
	"os"
)

// Static reports whether the executable f is statically linked: an ELF
// file with no program interpreter (PT_INTERP), so the kernel runs it
// without the host's dynamic loader and it needs no shared library. Only
// such an init can run in a sandbox whose root is not the host's (an image
// without glibc, or a busybox/musl one). A Go binary is static when built
// with CGO_ENABLED=0 and -buildmode=exe; -buildmode=pie, and any cgo,
// give it /lib64/ld-linux-x86-64.so.2 as its interpreter. Reads through
// f's ReadAt, so f's offset is untouched.
func Static(f *os.File) (bool, error) {
	e, err := elf.NewFile(f)
	if err != nil {
		return false, fmt.Errorf("%s is not an ELF executable: %w", f.Name(), err)
	}
	// Not e.Close: it would close f.
	for _, p := range e.Progs {
		if p.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return e.Type == elf.ET_EXEC || e.Type == elf.ET_DYN, nil
}
