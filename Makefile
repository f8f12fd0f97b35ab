# The two commands a newcomer needs: `make run` and `make test`.
.PHONY: run test build clean

run:
	./scripts/run.sh $(ARGS)

test:
	./scripts/test.sh

build:
	go build -o bin/sandbox-sidecar ./cmd/sandbox-sidecar

clean:
	rm -rf bin
