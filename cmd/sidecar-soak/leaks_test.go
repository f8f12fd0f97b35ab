package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestInCgroupOf(t *testing.T) {
	ids := map[string]bool{"sc-0123456789abcdef": true}
	assert.True(t, inCgroupOf("0::/sandbox-sidecar/sc-0123456789abcdef/init\n", ids))
	assert.True(t, inCgroupOf("12:memory:/sandbox-sidecar/sc-0123456789abcdef\n0::/x\n", ids))
	assert.False(t, inCgroupOf("0::/sandbox-sidecar/sc-0123456789abcdee\n", ids))
	assert.False(t, inCgroupOf("0::/user.slice\n", ids))
}

func TestProcMatchers(t *testing.T) {
	state := "/var/lib/x/state"
	bw := bwrapProcesses(state)
	id, ok := bw("PATH=/bin\x00"+markerEnv+"="+markerPrefix(state)+"sc-0123456789abcdef\x00HOME=/", "bwrap\x00--")
	assert.True(t, ok)
	assert.Equal(t, "sc-0123456789abcdef", id)
	_, ok = bw(markerEnv+"="+markerPrefix("/other")+"sc-0123456789abcdef", "")
	assert.False(t, ok, "another daemon's sandbox")

	gv := gvisorProcesses(state)
	id, ok = gv("", "runsc\x00--root="+state+"/gvisor/.runsc\x00boot\x00--bundle="+state+"/gvisor/sc-0123456789abcdef/bundle\x00c1")
	assert.True(t, ok)
	assert.Equal(t, "sc-0123456789abcdef", id)
	id, ok = gv("", "runsc\x00--root="+state+"/gvisor/.runsc\x00gofer\x00--bundle\x00"+state+"/gvisor/sc-1/bundle")
	assert.True(t, ok)
	assert.Equal(t, "sc-1", id)
	_, ok = gv("", "runsc\x00--root=/elsewhere/gvisor/.runsc\x00boot")
	assert.False(t, ok, "another root")
}
