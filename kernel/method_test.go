package kernel

import (
	"strings"
	"testing"
)

func TestMethodPatterns(t *testing.T) {
	for _, tc := range []struct {
		pattern, method string
		match           bool
	}{
		{"Echo.Echo", "Echo.Echo", true},
		{"Echo.Echo", "Echo.EchoMore", false},
		{"Echo.*", "Echo.Echo", true},
		{"Echo.*", "Echo.", true},
		{"Echo.*", "EchoX.Echo", false},
		{"*", "any.Method", true},
		{"echo.*", "Echo.Echo", false}, // case matters, as in method names
	} {
		if err := CheckMethodPattern(tc.pattern); err != nil {
			t.Errorf("CheckMethodPattern(%q) = %v; want nil", tc.pattern, err)
		}
		if got := MatchMethod(tc.pattern, tc.method); got != tc.match {
			t.Errorf("MatchMethod(%q, %q) = %v; want %v", tc.pattern, tc.method, got, tc.match)
		}
	}
	for pattern, says := range map[string]string{
		"":            "names no method",
		"  ":          "names no method",
		"Echo.*.Slow": "a * may only end a pattern",
		"*Echo":       "a * may only end a pattern",
		"Echo.**":     "a * may only end a pattern",
	} {
		if err := CheckMethodPattern(pattern); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("CheckMethodPattern(%q) = %v; want an error saying %q", pattern, err, says)
		}
	}
}
