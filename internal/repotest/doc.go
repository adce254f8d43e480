// Package repotest holds tests about the repository as a whole: rules every
// package keeps, checked so they cannot drift.
package repotest
