package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kernrpc/kernrpc/generic"
)

// sourceFor is where list and describe read descriptors: the server at
// target, or -protoset alone when no target is given.
func sourceFor(d *dialFlags, target string) (generic.Source, func(), error) {
	if target == "" {
		src, err := d.sourceOnly()
		return src, func() {}, err
	}
	e, err := d.dial(target)
	if err != nil {
		return nil, nil, err
	}
	return e.source, e.Close, nil
}

func list(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("list", "list [flags] ADDR [SERVICE]\n       kernrpc list -protoset FILE [SERVICE]\n\n"+
		"Lists the services a server serves (through its reflection service) or a descriptor set\n"+
		"declares, each with its methods: kind, request and response messages.", stderr)
	var d dialFlags
	d.add(fs, false)
	pos, err := parseAnywhere(fs, args, 0, 2)
	if err != nil {
		return err
	}
	target, only := splitTarget(&d, pos)
	only = strings.TrimPrefix(only, ".")
	src, done, err := sourceFor(&d, target)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := ctxFor(ctx, d.timeout)
	defer cancel()
	svcs, err := src.Services(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	found := false
	for _, s := range svcs {
		if only != "" && s.Name != only {
			continue
		}
		found = true
		where := s.File
		if !s.Described {
			where = "(by name only: no descriptor)"
		}
		fmt.Fprintf(tw, "%s\t%s\n", s.Name, where)
		for _, m := range s.Methods {
			types := ""
			if m.Input != "" {
				types = fmt.Sprintf("\t%s → %s", m.Input, m.Output)
			}
			fmt.Fprintf(tw, "  %s\t%s%s\n", m.Name, m.Kind, types)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if only != "" && !found {
		return fmt.Errorf("%w %q; known: %s", generic.ErrUnknownService, only, serviceNames(svcs))
	}
	return nil
}

// splitTarget reads [ADDR] [NAME]: with -protoset and one argument that
// is no address, the argument is the name.
func splitTarget(d *dialFlags, pos []string) (target, name string) {
	switch {
	case len(pos) == 2:
		return pos[0], pos[1]
	case len(pos) == 1 && d.protoset != "" && !isAddress(pos[0]) && d.config == "" && d.registry == "":
		return "", pos[0]
	case len(pos) == 1:
		return pos[0], ""
	}
	return "", ""
}

func serviceNames(svcs []generic.Service) string {
	names := make([]string, 0, len(svcs))
	for _, s := range svcs {
		names = append(names, s.Name)
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func describe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("describe", "describe [flags] ADDR NAME\n       kernrpc describe -protoset FILE NAME\n\n"+
		"Prints a service, a method (SERVICE.METHOD, with its messages) or a message by full name,\n"+
		"in .proto syntax, from the server's reflection service or a descriptor set.", stderr)
	var d dialFlags
	d.add(fs, false)
	pos, err := parseAnywhere(fs, args, 1, 2)
	if err != nil {
		return err
	}
	target, name := splitTarget(&d, pos)
	if name == "" {
		fs.Usage()
		return errUsage
	}
	// A leading dot, as describe prints message types, names the same.
	name = strings.TrimPrefix(name, ".")
	src, done, err := sourceFor(&d, target)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := ctxFor(ctx, d.timeout)
	defer cancel()
	desc, err := src.FindDescriptor(ctx, protoreflect.FullName(name))
	if errors.Is(err, generic.ErrNotFound) {
		return notFound(ctx, src, name, err)
	}
	if err != nil {
		return err
	}
	return printDescriptor(stdout, desc)
}

// notFound says why name has no descriptor: a service or method served by
// name only, or a misspelt name (then what there is).
func notFound(ctx context.Context, src generic.Source, name string, err error) error {
	svcs, lerr := src.Services(ctx)
	if lerr != nil {
		return err
	}
	for _, s := range svcs {
		if s.Name == name && !s.Described {
			var methods []string
			for _, m := range s.Methods {
				methods = append(methods, m.Name)
			}
			return fmt.Errorf("service %q is %w; it serves %s", name, generic.ErrNotDescribed, strings.Join(methods, ", "))
		}
	}
	// Only a dotted name can be a method; FindMethod's complaint about
	// any other (want SERVICE.METHOD) would not fit what describe takes.
	if strings.Contains(name, ".") {
		if _, merr := generic.FindMethod(ctx, src, name); merr != nil && !errors.Is(merr, generic.ErrUnknownService) {
			return merr
		}
	}
	return fmt.Errorf("%w; services: %s", err, serviceNames(svcs))
}
