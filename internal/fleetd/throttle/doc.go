// Package throttle lets through the first few events of each key in a
// window of time and counts the rest, in bounded memory. fleetd's service
// uses it so that hostile traffic costs a bounded number of log lines (per
// refusal reason and source, with a summary of what was dropped) and of
// audit records (per token and refusal reason).
//
// A key is a group (a refusal reason: a small fixed set the caller owns)
// and a sub-key (a source address, a token id: as many as an attacker
// likes). At most Config.MaxKeys keys are remembered; past that, new
// sub-keys of a group share one budget.
package throttle
