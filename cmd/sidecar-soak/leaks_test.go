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
