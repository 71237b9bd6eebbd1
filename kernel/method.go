package kernel

import (
	"errors"
	"strings"
)

// A method pattern names the methods a filter applies to, in a config's
// filters[].methods and in plugins' per-method options: a full method
// name ("Echo.Echo"), or a prefix ending in "*" ("Echo.*", "*" for every
// method). One form everywhere, so that a pattern means the same to the
// engine and to every plugin.

// CheckMethodPattern says what is wrong with pattern, or returns nil. A
// pattern that could match nothing (empty, or with a * before its end,
// which would be compared as written) is an error rather than a filter
// that silently applies to no method.
func CheckMethodPattern(pattern string) error {
	switch i := strings.IndexByte(pattern, '*'); {
	case strings.TrimSpace(pattern) == "":
		return errors.New("names no method")
	case i >= 0 && i != len(pattern)-1:
		return errors.New(`has a * before its end; a * may only end a pattern, as in "Echo.*"`)
	}
	return nil
}

// MatchMethod reports whether method is one pattern names.
func MatchMethod(pattern, method string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(method, prefix)
	}
	return pattern == method
}
