# The two commands a newcomer needs: `make run` and `make test`.
.PHONY: run test build bench soak deb image clean

run:
	./scripts/run.sh $(ARGS)

test:
	./scripts/test.sh

# The daemon, and beside it the sandboxes' init, static as the package builds
# it (docs/design.md, "A static init"); the daemon finds it there.
build:
	go build -o bin/sandbox-sidecar ./cmd/sandbox-sidecar
	CGO_ENABLED=0 go build -o bin/sandbox-sidecar-init ./cmd/sandbox-sidecar-init

# Measure (minutes; run on an otherwise idle machine) and rewrite the
# generated table in docs/benchmarks.md.
bench: build
	go run ./cmd/sidecar-bench --daemon-bin bin/sandbox-sidecar --json bench.json --md docs/benchmarks.md

# Chaos soak (root; a few minutes): agents (pauses, resumes, code contexts,
# forks and snapshots among what they do), client kills, daemon kill -9,
# restarts and SIGSTOPs against the real daemon, then its invariants are
# checked (no leak, no hang, owned sandboxes, acknowledged files, durable
# processes and contexts' state intact). SOAK_DURATION=90s shortens it;
# SOAK_FLAGS adds flags (e.g. --backend gvisor --runsc PATH --agents 4).
soak: build
	go build -o bin/sidecar-soak ./cmd/sidecar-soak
	bin/sidecar-soak --daemon-bin bin/sandbox-sidecar --duration $(or $(SOAK_DURATION),3m) $(SOAK_FLAGS)

# The Debian package, bin/sandbox-sidecar_<version>_<arch>.deb; VERSION=...
# sets the version (default: a snapshot of packaging/deb/changelog's).
deb:
	VERSION=$(VERSION) ./packaging/deb/build.sh bin

# The container image, bin/sandbox-sidecar-image.tar (an OCI archive), from a
# debootstrapped Debian and the daemon; no base image is pulled. Needs root
# and debootstrap. VERSION=... sets the version and the tag.
image:
	VERSION=$(VERSION) ./packaging/image/build.sh bin

clean:
	rm -rf bin
