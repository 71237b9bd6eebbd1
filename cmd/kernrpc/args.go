package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// parseAnywhere parses flags placed before, between or after the
// positional arguments (`kernrpc bench ADDR M '{}' -c 64 -d 10s`) and
// returns the positional ones, at least min and at most max of them
// (max < 0: any number). After "--" everything is positional.
func parseAnywhere(fs *flag.FlagSet, args []string, min, max int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				return nil, err
			}
			return nil, errUsage
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if len(pos) < min || (max >= 0 && len(pos) > max) {
		if len(pos) < min {
			fmt.Fprintf(fs.Output(), "missing arguments\n")
		} else {
			fmt.Fprintf(fs.Output(), "unexpected arguments: %q\n", pos[max:])
		}
		fs.Usage()
		return nil, errUsage
	}
	return pos, nil
}

// timeoutFlag is a -timeout: a duration above zero, since a call given
// none would fail at once, before it is sent.
type timeoutFlag time.Duration

func (t *timeoutFlag) String() string { return time.Duration(*t).String() }

func (t *timeoutFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration such as 500ms or 5s", s)
	}
	if d <= 0 {
		return fmt.Errorf("%s: a call needs a timeout above zero, such as 5s", s)
	}
	*t = timeoutFlag(d)
	return nil
}

// metadataFlag collects repeated -H key=value flags.
type metadataFlag kernel.Metadata

func (m *metadataFlag) String() string {
	keys := make([]string, 0, len(*m))
	for k := range *m {
		keys = append(keys, k+"="+(*m)[k])
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}

func (m *metadataFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not key=value", s)
	}
	if *m == nil {
		*m = metadataFlag{}
	}
	(*m)[k] = v
	return nil
}

// readData is a request given on the command line: JSON itself, @FILE for
// a file's contents, or - for standard input.
func readData(arg string, stdin io.Reader) ([]byte, error) {
	switch {
	case arg == "-":
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("read the request from standard input: %w", err)
		}
		return b, nil
	case strings.HasPrefix(arg, "@"):
		b, err := os.ReadFile(arg[1:])
		if err != nil {
			return nil, fmt.Errorf("read the request: %w", err)
		}
		return b, nil
	}
	return []byte(arg), nil
}

// usageProblem prints problem and the command's usage, and returns
// errUsage: for a mistake in how the command was invoked, which exits 2
// like a flag that does not parse.
func usageProblem(fs *flag.FlagSet, problem string) error {
	fmt.Fprintln(fs.Output(), problem)
	fs.Usage()
	return errUsage
}
