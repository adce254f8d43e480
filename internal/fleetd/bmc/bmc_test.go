package bmc

import (
	"context"
	"errors"
	"slices"
	"testing"
)

func TestFakeBMCRecordsInOrder(t *testing.T) {
	ctx := context.Background()
	f := &FakeBMC{}
	m := Target{NodeID: "web-01", ProductUUID: "6a1f5c1e-0000-4000-8000-000000000001"}
	for _, step := range []func() error{
		func() error { return f.SetNextBoot(ctx, m, PXE) },
		func() error { return f.PowerCycle(ctx, m) },
		func() error { return f.PowerOff(ctx, m) },
		func() error { return f.PowerOn(ctx, m) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	want := []Action{{m, ActionSetNextBoot, PXE}, {m, ActionPowerCycle, ""}, {m, ActionPowerOff, ""}, {m, ActionPowerOn, ""}}
	if got := f.Actions(); !slices.Equal(got, want) {
		t.Fatalf("actions %+v, want %+v", got, want)
	}
}

func TestFakeBMCErr(t *testing.T) {
	boom := errors.New("boom")
	f := &FakeBMC{Err: boom}
	err := f.PowerCycle(context.Background(), Target{NodeID: "web-01"})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want %v", err, boom)
	}
	if n := len(f.Actions()); n != 1 {
		t.Fatalf("%d actions recorded, want the failed one", n)
	}
}
