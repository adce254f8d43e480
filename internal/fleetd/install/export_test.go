package install

// SetObserve makes r tell observe each fetch's outcome once the fetch is
// over (its burn, or the return of its claim, included).
func SetObserve(r *Releaser, observe func(outcome string)) { r.observe = observe }
