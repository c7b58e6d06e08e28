package soak

import (
	"errors"
	"math"
)

// Fit is a least-squares line y = Intercept + Slope*x.
type Fit struct {
	Intercept, Slope float64
	// SlopeSE is the standard error of Slope (residual variance over
	// n-2 degrees of freedom); 0 for a perfect fit, NaN for n < 3.
	SlopeSE float64
	N       int
}

// LinearFit fits y against x by ordinary least squares.
func LinearFit(x, y []float64) (Fit, error) {
	if len(x) != len(y) {
		return Fit{}, errors.New("soak: fit: x and y differ in length")
	}
	n := len(x)
	if n < 2 {
		return Fit{}, errors.New("soak: fit: fewer than two points")
	}
	var mx, my float64
	for i := range x {
		mx += x[i]
		my += y[i]
	}
	mx /= float64(n)
	my /= float64(n)
	var sxx, sxy float64
	for i := range x {
		dx := x[i] - mx
		sxx += dx * dx
		sxy += dx * (y[i] - my)
	}
	if sxx == 0 {
		return Fit{}, errors.New("soak: fit: every x is the same")
	}
	f := Fit{Slope: sxy / sxx, N: n}
	f.Intercept = my - f.Slope*mx
	if n < 3 {
		f.SlopeSE = math.NaN()
		return f, nil
	}
	var ssr float64
	for i := range x {
		r := y[i] - (f.Intercept + f.Slope*x[i])
		ssr += r * r
	}
	f.SlopeSE = math.Sqrt(ssr / float64(n-2) / sxx)
	return f, nil
}

// Grows reports whether the fit shows growth: a positive slope more than
// three standard errors from zero.
func (f Fit) Grows() bool {
	return f.Slope > 0 && f.Slope > 3*f.SlopeSE
}
