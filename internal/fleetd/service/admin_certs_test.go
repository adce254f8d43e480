package service_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/adminv1"
)

func TestListCerts(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(t, "web")
	e.newNode(t, "db")
	client, _ := e.nodeClients(t, n)
	e.clock.Advance(30 * time.Second)
	r := e.renewal(t, n)
	resp, err := client.Renew(t.Context(), r.req)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	next := e.renewed(t, n, r, resp.Signed)
	if _, err := e.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: "web", Reason: "lost"}); err != nil {
		t.Fatalf("RevokeNode: %v", err)
	}

	list := func(req *adminv1.ListCertsRequest) []*adminv1.CertInfo {
		t.Helper()
		got, err := e.admin.ListCerts(t.Context(), req)
		if err != nil {
			t.Fatalf("ListCerts(%v): %v", req, err)
		}
		return got.Certs
	}
	cs := list(&adminv1.ListCertsRequest{NodeId: "web"})
	if len(cs) != 2 {
		t.Fatalf("ListCerts(web) = %v, want the renewed and the joined certificate", cs)
	}
	renewed, joined := cs[0], cs[1]
	if renewed.Serial != next.serial() || renewed.Kind != "renew" || renewed.Generation != n.gen || renewed.NodeId != "web" ||
		renewed.IssuedUnix != e.clock.Now().Unix() || renewed.NotAfterUnix != next.leaf.Leaf.NotAfter.Unix() {
		t.Errorf("newest certificate %v, want the renewal %s", renewed, next.serial())
	}
	if joined.Serial != n.serial() || joined.Kind != "join" || joined.NotAfterUnix != n.leaf.Leaf.NotAfter.Unix() {
		t.Errorf("older certificate %v, want the join %s", joined, n.serial())
	}
	for _, c := range cs {
		if c.RevokedUnix != e.clock.Now().Unix() || c.RevokedReason != "lost" {
			t.Errorf("certificate %s revoked at %d for %q, want %d for lost", c.Serial, c.RevokedUnix, c.RevokedReason, e.clock.Now().Unix())
		}
	}
	if cs := list(&adminv1.ListCertsRequest{NodeId: "web", Limit: 1}); len(cs) != 1 || cs[0].Serial != next.serial() {
		t.Errorf("ListCerts(web, 1) = %v, want only the renewal", cs)
	}
	if cs := list(&adminv1.ListCertsRequest{NodeId: "db"}); len(cs) != 1 || cs[0].RevokedUnix != 0 {
		t.Errorf("ListCerts(db) = %v, want its one unrevoked certificate", cs)
	}
	if cs := list(&adminv1.ListCertsRequest{NodeId: "mail", Limit: 1 << 30}); len(cs) != 0 {
		t.Errorf("ListCerts(mail) = %v, want none", cs)
	}
	_, err = e.admin.ListCerts(t.Context(), &adminv1.ListCertsRequest{})
	wantStatus(t, err, codes.InvalidArgument, "name the node whose certificates to list")
}
