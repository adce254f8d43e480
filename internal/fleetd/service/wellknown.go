package service

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/pki"
)

// WellKnownPath is where the HTTPS listener serves the document.
const WellKnownPath = "/.well-known/nodetrust.json"

// WellKnownDocument renders the document for an authority; servers are the
// replicas' addresses nodes may use (none: the document names none).
func WellKnownDocument(a *pki.Authority, servers []string) ([]byte, error) {
	jwk, err := a.JoinEncryption.Public().MarshalJWK()
	if err != nil {
		return nil, fmt.Errorf("well-known document: %w", err)
	}
	b := a.Bundle
	doc := pki.WellKnown{
		Version:              1,
		TrustDomain:          a.TrustDomain,
		ServerName:           b.ServerName,
		ServingCASPKIPin:     b.ServingCASPKIPin.String(),
		JoinSigningKeyPin:    b.JoinSigningKeyPin.String(),
		JoinEncryptionKeyPin: b.JoinEncryptionKeyPin.String(),
		JoinEncryptionJWK:    jwk,
		Servers:              servers,
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("well-known document: %w", err)
	}
	return append(out, '\n'), nil
}

// HTTPHandler serves the well-known document and the metrics.
func (s *Server) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+WellKnownPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "max-age=300")
		_, _ = w.Write(s.wellKnown)
	})
	mux.Handle("GET /metrics", s.metrics.handler())
	s.exportRoutes(mux)
	return mux
}

func (j *joinService) GetWellKnown(context.Context, *joinv1.GetWellKnownRequest) (*joinv1.GetWellKnownResponse, error) {
	return &joinv1.GetWellKnownResponse{Document: j.s.wellKnown, ServerTimeUnixNano: j.s.cfg.Now().UnixNano()}, nil
}
