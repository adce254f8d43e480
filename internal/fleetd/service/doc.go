// Package service implements the control plane's gRPC services (JoinService,
// Admin) and its HTTPS well-known document. It maps store and verification
// errors to wire codes in one place, and keeps the reason for a refusal
// apart from what the caller is told: every refused join is
// PERMISSION_DENIED "Join refused", and the reason goes to the log and the
// audit trail only.
package service
