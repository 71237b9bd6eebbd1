package weightedrandom_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/balancer/weightedrandom"
)

var info = &kernel.CallInfo{Method: "Echo.Say"}

// none, as a weight, leaves the instance's weight out.
const none = "<none>"

// weighted returns one instance per weight.
func weighted(key string, weights ...string) []kernel.Instance {
	set := make([]kernel.Instance, len(weights))
	for i, w := range weights {
		set[i] = kernel.Instance{Service: "echo", ID: fmt.Sprint("i", i), Address: fmt.Sprint("10.0.0.", i, ":7000")}
		if w != none {
			set[i].Metadata = map[string]string{key: w}
		}
	}
	return set
}

// shares picks n times and returns each instance's share of the picks, by
// index into set.
func shares(t *testing.T, b kernel.Balancer, set []kernel.Instance, n int) []float64 {
	t.Helper()
	counts := make([]float64, len(set))
	for range n {
		p, err := b.Pick(context.Background(), info)
		if err != nil {
			t.Fatalf("Pick: %v", err)
		}
		found := false
		for i := range set {
			if p == &set[i] {
				counts[i]++
				found = true
			}
		}
		if !found {
			t.Fatalf("Pick returned %+v, not a pointer into the set given to Update", *p)
		}
	}
	for i := range counts {
		counts[i] /= float64(n)
	}
	return counts
}

func build(t *testing.T, o weightedrandom.Options) *weightedrandom.Balancer {
	t.Helper()
	b, err := weightedrandom.New(o)
	if err != nil {
		t.Fatalf("New(%+v): %v", o, err)
	}
	return b
}

// within fails unless each got[i] is want[i] ± 0.02 (20000 picks: the
// standard deviation of a share is at most 0.0036).
func within(t *testing.T, got, want []float64, what string) {
	t.Helper()
	for i := range want {
		if math.Abs(got[i]-want[i]) > 0.02 {
			t.Errorf("%s: shares %.3f, want %.3f", what, got, want)
			return
		}
	}
}

func TestSharesFollowWeights(t *testing.T) {
	cases := []struct {
		name    string
		opts    weightedrandom.Options
		key     string
		weights []string
		want    []float64
	}{
		{"weights 1, 3", *weightedrandom.DefaultOptions(), "weight", []string{"1", "3"}, []float64{0.25, 0.75}},
		{"a missing weight counts as default_weight 1", *weightedrandom.DefaultOptions(), "weight", []string{none, "3"}, []float64{0.25, 0.75}},
		{"default_weight 3 for a missing weight", weightedrandom.Options{WeightKey: "weight", DefaultWeight: 3}, "weight", []string{"1", none}, []float64{0.25, 0.75}},
		{"weight 0 takes an instance out", *weightedrandom.DefaultOptions(), "weight", []string{"0", "1", "1"}, []float64{0, 0.5, 0.5}},
		{"every weight 0: uniform", *weightedrandom.DefaultOptions(), "weight", []string{"0", "0"}, []float64{0.5, 0.5}},
		{"weight_key names the key", weightedrandom.Options{WeightKey: "w", DefaultWeight: 1}, "w", []string{"1", "1", "2"}, []float64{0.25, 0.25, 0.5}},
		{"largest weight beside weight 1", *weightedrandom.DefaultOptions(), "weight", []string{"1", "2147483647"}, []float64{0, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := build(t, tc.opts)
			set := weighted(tc.key, tc.weights...)
			b.Update(set)
			within(t, shares(t, b, set, 20000), tc.want, strings.Join(tc.weights, ","))
		})
	}
}

func TestWeightsAreReadAgainOnEveryUpdate(t *testing.T) {
	b := build(t, *weightedrandom.DefaultOptions())
	first := weighted("weight", "1", "3")
	b.Update(first)
	within(t, shares(t, b, first, 20000), []float64{0.25, 0.75}, "first update")
	second := weighted("weight", "3", "1") // same IDs, weights swapped
	b.Update(second)
	within(t, shares(t, b, second, 20000), []float64{0.75, 0.25}, "after the weights changed")
}

// logged captures a balancer's log lines.
func logged(o *weightedrandom.Options) *bytes.Buffer {
	var buf bytes.Buffer
	o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	return &buf
}

func TestMalformedWeightCountsAsDefaultAndWarnsOnce(t *testing.T) {
	for _, bad := range []string{"heavy", "-3", "1.5", "", " 2", "2147483648", "99999999999999999999"} {
		t.Run(fmt.Sprintf("%q", bad), func(t *testing.T) {
			o := weightedrandom.Options{WeightKey: "weight", DefaultWeight: 3}
			buf := logged(&o)
			b := build(t, o)
			set := weighted("weight", "1", bad)
			b.Update(set)
			within(t, shares(t, b, set, 20000), []float64{0.25, 0.75}, "malformed weight as default_weight 3")
			b.Update(weighted("weight", "1", bad))
			b.Update(weighted("weight", "1", bad))
			if n := strings.Count(buf.String(), "level=WARN"); n != 1 {
				t.Fatalf("three Updates with weight %q logged %d warnings, want 1:\n%s", bad, n, buf)
			}
			for _, want := range []string{"malformed", "instance=i1", "key=weight", "default_weight=3"} {
				if !strings.Contains(buf.String(), want) {
					t.Errorf("warning %q does not mention %q", buf, want)
				}
			}
			// Fixed, then broken again: a new warning.
			b.Update(weighted("weight", "1", "2"))
			b.Update(weighted("weight", "1", bad))
			if n := strings.Count(buf.String(), "level=WARN"); n != 2 {
				t.Errorf("a weight fixed and broken again logged %d warnings in all, want 2:\n%s", n, buf)
			}
		})
	}
}

func TestBadOptions(t *testing.T) {
	cases := []struct {
		name    string
		options map[string]any
		key     string
	}{
		{"empty weight_key", map[string]any{"weight_key": ""}, "weight_key"},
		{"negative default_weight", map[string]any{"default_weight": -1}, "default_weight"},
		{"default_weight over the largest weight", map[string]any{"default_weight": int64(1 << 31)}, "default_weight"},
		{"default_weight of the wrong type", map[string]any{"default_weight": "one"}, "default_weight"},
		{"unknown option", map[string]any{"weights": 1}, "weights"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := kernel.NewBalancer(weightedrandom.Name, tc.options, "svc.yaml")
			if err == nil {
				t.Fatalf("NewBalancer with %v succeeded; want an error", tc.options)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("option %q", tc.key)) {
				t.Errorf("error %q does not name option %q", err, tc.key)
			}
			if !strings.Contains(err.Error(), "svc.yaml") || !strings.Contains(err.Error(), weightedrandom.Name) {
				t.Errorf("error %q does not name the file and the balancer", err)
			}
		})
	}
}

func TestRegisteredUnderName(t *testing.T) {
	b, err := kernel.NewBalancer(weightedrandom.Name, nil, "test")
	if err != nil {
		t.Fatalf("NewBalancer(%q): %v", weightedrandom.Name, err)
	}
	if _, ok := b.(*weightedrandom.Balancer); !ok {
		t.Errorf("NewBalancer(%q) built a %T", weightedrandom.Name, b)
	}
}

func TestNoInstances(t *testing.T) {
	for name, update := range map[string]func(*weightedrandom.Balancer){
		"never updated":     func(*weightedrandom.Balancer) {},
		"empty set":         func(b *weightedrandom.Balancer) { b.Update([]kernel.Instance{}) },
		"empty after a set": func(b *weightedrandom.Balancer) { b.Update(weighted("weight", "1")); b.Update(nil) },
	} {
		t.Run(name, func(t *testing.T) {
			b := build(t, *weightedrandom.DefaultOptions())
			update(b)
			p, err := b.Pick(context.Background(), info)
			if p != nil || !errors.Is(err, kernel.ErrNoInstances) {
				t.Fatalf("Pick = %v, %v; want nil and an error wrapping kernel.ErrNoInstances", p, err)
			}
			for _, want := range []string{"weighted-random", "Echo.Say"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	b := build(t, *weightedrandom.DefaultOptions())
	b.Update(weighted("weight", "1", "2", "3", "4", "5"))
	ctx := context.Background()
	if allocs := testing.AllocsPerRun(1000, func() { _, _ = b.Pick(ctx, info) }); allocs != 0 {
		t.Errorf("Pick: %.1f allocations per call, want 0", allocs)
	}
}

func BenchmarkPick(b *testing.B) {
	for _, n := range []int{8, 1024} {
		b.Run(fmt.Sprint(n, "instances"), func(b *testing.B) {
			bal, err := weightedrandom.New(*weightedrandom.DefaultOptions())
			if err != nil {
				b.Fatal(err)
			}
			weights := make([]string, n)
			for i := range weights {
				weights[i] = fmt.Sprint(1 + i%7)
			}
			bal.Update(weighted("weight", weights...))
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := bal.Pick(ctx, info); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// An ID listed at two addresses (Consul lists a service another program
// registered on several nodes under one ID) is two servers: each
// malformed weight is warned of once, not on every Update.
func TestMalformedWeightsUnderSharedIDWarnOnce(t *testing.T) {
	o := weightedrandom.Options{WeightKey: "weight", DefaultWeight: 1}
	buf := logged(&o)
	b := build(t, o)
	set := func() []kernel.Instance {
		return []kernel.Instance{
			{Service: "echo", ID: "shared", Address: "10.0.0.1:7000", Metadata: map[string]string{"weight": "heavy"}},
			{Service: "echo", ID: "shared", Address: "10.0.0.2:7000", Metadata: map[string]string{"weight": "light"}},
		}
	}
	for range 3 {
		b.Update(set())
	}
	if n := strings.Count(buf.String(), "level=WARN"); n != 2 {
		t.Fatalf("three Updates of one ID at two addresses, each with a malformed weight, logged %d warnings, want 2:\n%s", n, buf)
	}
	for _, want := range []string{"address=10.0.0.1:7000", "address=10.0.0.2:7000"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the warnings do not mention %q:\n%s", want, buf)
		}
	}
}
