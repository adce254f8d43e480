// Package storefault wraps a store.Store so that a test can make a chosen
// call fail, or run something just before it, while every other call
// reaches the real store underneath.
//
// Calls are counted per method. FailAt(method, n, err) makes the nth call
// of method from now on (1 is the next) return err without reaching the
// store; Before(method, n, fn) runs fn first and fails the call only when
// fn returns an error, so a test can change the store between a handler's
// steps (revoke a node just before its renewal is recorded, say). A method
// is named as store.Store spells it; a name store.Store does not have
// panics, so a renamed method cannot silently disarm a test.
//
// The wrapper embeds the store it wraps: a method added to store.Store
// later still compiles and delegates, and TestEveryMethodCanFail fails until
// it is given an override here.
package storefault
