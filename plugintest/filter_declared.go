package plugintest

import "github.com/kernrpc/kernrpc/kernel"

// filterSided checks the side a kernel.SidedFilter declares against
// FilterConfig.Side and returns cfg with that side: the engine keeps such
// a filter to its side, so the suite checks it there only.
func filterSided(t tb, f kernel.Factory[kernel.Filter], cfg FilterConfig) FilterConfig {
	t.Helper()
	probe := build(t, f, cfg.Options)
	sf, ok := probe.(kernel.SidedFilter)
	var only kernel.Side
	if ok {
		only = sf.Side()
	}
	closePlugin(probe)
	switch {
	case !ok:
	case only != kernel.ClientSide && only != kernel.ServerSide:
		t.Fatalf("the filter declares (kernel.SidedFilter) side %s, which is neither client nor server", only)
	case cfg.Side != 0 && cfg.Side != only:
		t.Fatalf("FilterConfig.Side is %s, but the filter declares (kernel.SidedFilter) that it works on the %s side "+
			"only, the one the engine keeps it to; set Side to %s or leave it out", cfg.Side, only, only)
	default:
		cfg.Side = only
	}
	return cfg
}

// filterStaged checks the stage a kernel.StagedFilter declares and
// returns cfg with it: the engine refuses a filter that declares a stage
// other than call or attempt, and gives one in the attempt stage a
// CallInfo with the picked instance, as the suite then does.
func filterStaged(t tb, f kernel.Factory[kernel.Filter], cfg FilterConfig) FilterConfig {
	t.Helper()
	probe := build(t, f, cfg.Options)
	sf, ok := probe.(kernel.StagedFilter)
	var stage kernel.Stage
	if ok {
		stage = sf.Stage()
	}
	closePlugin(probe)
	switch {
	case !ok:
		t.Skipf("the filter does not implement kernel.StagedFilter; the engine runs it in the call stage unless its config names one")
	case stage != kernel.CallStage && stage != kernel.AttemptStage:
		t.Fatalf("the filter declares (kernel.StagedFilter) stage %s, which is neither call nor attempt: the engine refuses a "+
			"client config with it; return kernel.CallStage or kernel.AttemptStage", stage)
	}
	cfg.stage = stage
	return cfg
}
