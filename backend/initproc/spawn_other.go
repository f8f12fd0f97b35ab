//go:build !amd64

package initproc

func spawn(prog string, argv []string, attr SpawnAttr) (int, error) {
	return forkExec(prog, argv, attr)
}
