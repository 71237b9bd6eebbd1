package plugintest

import (
	"context"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// stagedFilter passes every call on, and declares stage. In the attempt
// stage it tags the call with the picked instance's address, as a
// per-host breaker or metric keys on it.
type stagedFilter struct{ stage kernel.Stage }

func (f stagedFilter) Stage() kernel.Stage { return f.stage }

func (f stagedFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if info.Side == kernel.ClientSide && f.stage == kernel.AttemptStage {
		info.SetRequestMetadata("plugintest-host", info.Instance.Address) // set in the attempt stage
	}
	return next(ctx, info, req)
}

func stagedFactory(stage kernel.Stage) kernel.Factory[kernel.Filter] {
	return kernel.Factory[kernel.Filter]{Name: "staged", New: func(any) (kernel.Filter, error) { return stagedFilter{stage}, nil }}
}

// An attempt filter is given what the engine gives it, the picked
// instance: one that reads it passes.
func TestFilterChecksAnAttemptFilterAsTheEngineRunsIt(t *testing.T) {
	for _, stage := range []kernel.Stage{kernel.CallStage, kernel.AttemptStage} {
		rec := filterRecord(t, stagedFactory(stage), FilterConfig{})
		codecExpectClean(t, rec)
		if why := rec.skippedUnder("Filter/Stage"); why != "" {
			t.Errorf("stage %s: Filter/Stage skipped for a StagedFilter: %s", stage, why)
		}
	}
}

// A filter that declares a stage the engine does not know is caught by
// Filter/Stage, which ends the suite: the engine refuses its config.
func TestFilterCatchesAWrongStage(t *testing.T) {
	rec := filterRecord(t, stagedFactory(kernel.Stage(9)), FilterConfig{})
	expectCaught(t, rec, "Filter/Stage")
	expectMessage(t, rec, "Filter/Stage", "neither call nor attempt")
	if got := rec.failures; len(got) != 1 {
		t.Errorf("failures %v; want the one under Filter/Stage, and no check run after it", got)
	}
}
