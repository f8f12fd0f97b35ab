package backend

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestGuestTimeoutRoundsUpAndNeverZero(t *testing.T) {
	cases := []struct {
		in   time.Duration
		want string
	}{
		{time.Nanosecond, "0.001"},
		{999 * time.Microsecond, "0.001"},
		{time.Millisecond, "0.001"},
		{time.Millisecond + 1, "0.002"},
		{1500 * time.Millisecond, "1.500"},
		{time.Second, "1.000"},
		{90 * time.Second, "90.000"},
		{1000 * time.Hour, "86400.000"}, // clamped to MaxTimeout
	}
	for _, tc := range cases {
		if got := TimeoutSeconds(GuestTimeout(tc.in)); got != tc.want {
			t.Errorf("TimeoutSeconds(GuestTimeout(%v)) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestValidateEnvNeverEchoesValues(t *testing.T) {
	bad := []map[string]string{
		{"": "x"},
		{"A=B": "x"},
		{"A\x00": "x"},
		{"A": "secret\x00value"},
		{"A": strings.Repeat("s", MaxArgBytes)},
	}
	for _, env := range bad {
		err := ValidateEnv(env, "the test's")
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ValidateEnv(%q) = %v, want ErrInvalidArgument", env, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("the error quotes the value: %v", err)
		}
	}
	if err := ValidateEnv(map[string]string{"A": "", "weird name-1.x": "v=w"}, "x"); err != nil {
		t.Errorf("valid env refused: %v", err)
	}
	many := map[string]string{}
	for i := 0; i < 20; i++ {
		many[strings.Repeat("K", i+1)] = strings.Repeat("v", 100<<10)
	}
	if err := ValidateEnv(many, "x"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("2 MB of environment accepted: %v", err)
	}
}
