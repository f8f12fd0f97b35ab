#include "textflag.h"

// System calls (x86-64).
#define SYS_rt_sigprocmask 14
#define SYS_dup3 292
#define SYS_clone 56
#define SYS_execve 59
#define SYS_exit_group 231
#define SYS_chdir 80
#define SYS_setuid 105
#define SYS_setgid 106
#define SYS_setsid 112
#define SYS_setgroups 116
#define SIG_SETMASK 2

// Offsets in spawnArgs (spawn.go; TestSpawnArgsLayout checks them).
#define A_PATH 0
#define A_ARGV 8
#define A_ENVP 16
#define A_DIR 24
#define A_STDIN 32
#define A_STDOUT 40
#define A_STDERR 48
#define A_UID 56
#define A_GID 64
#define A_FLAGS 72
#define A_PIDFD 80
#define A_BLOCK 88
#define A_SAVED 96
#define A_EMPTY 104
#define A_ERRNO 112

// A system call's result in AX is an error when, unsigned, it is above
// -4096; CHILD_CHECK sends the child to fail with it.
#define CHILD_CHECK \
	CMPQ	AX, $-4096; \
	JHI	fail

// func rawSpawn(a *spawnArgs) (pid int64, errno uintptr)
//
// NOFRAME and no stack use after the clone: the child runs on the
// parent's stack, which the parent returns through once it resumes.
TEXT ·rawSpawn(SB),NOSPLIT|NOFRAME,$0-24
	MOVQ	a+0(FP), R12

	// Block every signal in this thread, saving its mask.
	MOVQ	$SYS_rt_sigprocmask, AX
	MOVQ	$SIG_SETMASK, DI
	LEAQ	A_BLOCK(R12), SI
	LEAQ	A_SAVED(R12), DX
	MOVQ	$8, R10
	SYSCALL
	CMPQ	AX, $-4096
	JHI	parentfail

	MOVQ	$SYS_clone, AX
	MOVQ	A_FLAGS(R12), DI
	XORQ	SI, SI          // the same stack
	MOVQ	A_PIDFD(R12), DX // parent_tid: CLONE_PIDFD's pidfd
	XORQ	R10, R10
	XORQ	R8, R8
	SYSCALL
	TESTQ	AX, AX
	JEQ	child

	// The parent, resumed once the child exec'd or exited: restore the
	// mask, then return the clone's result.
	MOVQ	AX, R13
	MOVQ	$SYS_rt_sigprocmask, AX
	MOVQ	$SIG_SETMASK, DI
	LEAQ	A_SAVED(R12), SI
	XORQ	DX, DX
	MOVQ	$8, R10
	SYSCALL
	MOVQ	R13, AX
	CMPQ	AX, $-4096
	JHI	parentfail
	MOVQ	AX, pid+8(FP)
	MOVQ	$0, errno+16(FP)
	RET
parentfail:
	NEGQ	AX
	MOVQ	$-1, pid+8(FP)
	MOVQ	AX, errno+16(FP)
	RET

child:
	MOVQ	$SYS_setsid, AX
	SYSCALL
	CHILD_CHECK

	MOVQ	A_UID(R12), R13
	TESTQ	R13, R13
	JS	nocred
	MOVQ	$SYS_setgroups, AX
	XORQ	DI, DI
	XORQ	SI, SI
	SYSCALL
	CHILD_CHECK
	MOVQ	$SYS_setgid, AX
	MOVQ	A_GID(R12), DI
	SYSCALL
	CHILD_CHECK
	MOVQ	$SYS_setuid, AX
	MOVQ	A_UID(R12), DI
	SYSCALL
	CHILD_CHECK
nocred:

	MOVQ	A_DIR(R12), DI
	TESTQ	DI, DI
	JEQ	nodir
	MOVQ	$SYS_chdir, AX
	SYSCALL
	CHILD_CHECK
nodir:

	// dup3 clears close-on-exec on the copies; Spawn made every source
	// descriptor 3 or above, so none is overwritten before it is copied.
	MOVQ	$SYS_dup3, AX
	MOVQ	A_STDIN(R12), DI
	MOVQ	$0, SI
	XORQ	DX, DX
	SYSCALL
	CHILD_CHECK
	MOVQ	$SYS_dup3, AX
	MOVQ	A_STDOUT(R12), DI
	MOVQ	$1, SI
	XORQ	DX, DX
	SYSCALL
	CHILD_CHECK
	MOVQ	$SYS_dup3, AX
	MOVQ	A_STDERR(R12), DI
	MOVQ	$2, SI
	XORQ	DX, DX
	SYSCALL
	CHILD_CHECK

	// The command's mask: empty.
	MOVQ	$SYS_rt_sigprocmask, AX
	MOVQ	$SIG_SETMASK, DI
	LEAQ	A_EMPTY(R12), SI
	XORQ	DX, DX
	MOVQ	$8, R10
	SYSCALL
	CHILD_CHECK

	MOVQ	$SYS_execve, AX
	MOVQ	A_PATH(R12), DI
	MOVQ	A_ARGV(R12), SI
	MOVQ	A_ENVP(R12), DX
	SYSCALL

fail:
	// Tell the parent in the memory it shares with us, and exit; the
	// parent resumes when this task is gone.
	NEGQ	AX
	MOVQ	AX, A_ERRNO(R12)
die:
	MOVQ	$SYS_exit_group, AX
	MOVQ	$127, DI
	SYSCALL
	JMP	die
