package console

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/adminv1"
)

// AdminVerdicts reads a node's verdicts with the Admin call ListVerdicts.
// A control plane without that call (UNIMPLEMENTED) records none.
type AdminVerdicts struct {
	Admin adminv1.AdminClient
}

// Verdicts implements VerdictSource.
func (a AdminVerdicts) Verdicts(ctx context.Context, nodeID string, limit int) ([]Verdict, error) {
	resp, err := a.Admin.ListVerdicts(ctx, &adminv1.ListVerdictsRequest{NodeId: nodeID, Limit: uint32(limit)})
	if status.Code(err) == codes.Unimplemented {
		return nil, ErrNotRecorded
	}
	if err != nil {
		st := status.Convert(err)
		return nil, fmt.Errorf("%s (%s)", st.Message(), st.Code())
	}
	out := make([]Verdict, 0, len(resp.Verdicts))
	for _, v := range resp.Verdicts {
		vd := Verdict{Time: time.Unix(0, v.TimeUnixNano), Stage: v.Stage, Class: v.Class, Passed: v.Passed}
		for _, f := range v.Failed {
			vd.Failed = append(vd.Failed, FailedRule{Rule: f.Rule, Reason: f.Reason})
		}
		out = append(out, vd)
	}
	return out, nil
}
