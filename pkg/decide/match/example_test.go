package match_test

import (
	"fmt"

	"github.com/carbd/carbd/pkg/decide/match"
)

// T_0 holds the values of the task; a gated field is trusted when it
// equals one of them after normalisation.
func ExampleValueSet() {
	var t match.ValueSet
	t.Add("task", match.Extract("Send the invoice to Bob@Example.com")...)
	mark := t.Len()
	t.Add("read_file:inbox.eml", "attacker@evil.example") // inside a speculative scope

	fmt.Println(t.Contains("bob@example.com"), t.Contains("attacker@evil.example"))
	o, _ := t.Origin("BOB@EXAMPLE.COM")
	fmt.Println(o)
	t.Truncate(mark) // the scope is aborted
	fmt.Println(t.Contains("attacker@evil.example"))
	// Output:
	// true true
	// task
	// false
}

// S_i holds the tokens of sensitive content; an effect carries sensitive
// data when a token occurs anywhere in it after normalisation.
func ExampleIndex_Scan() {
	var s match.Index
	s.Add("read_file:payroll.csv", 2, match.Extract("Jane Roe, IBAN DE89 3704 0044 0532 0130 00, salary 98,500")...)

	max, hits := s.Scan(`POST /upload {"note": "pay de89370400440532013000"}`)
	fmt.Println(max)
	for _, h := range hits {
		fmt.Printf("%s from %s at %d\n", h.Token, h.Origin, h.Offset)
	}
	_, found := s.MaxLevel("nothing sensitive here")
	fmt.Println(found)
	// Output:
	// 2
	// de89370400440532013000 from read_file:payroll.csv at 27
	// false
}

func ExampleExtract() {
	for _, v := range match.Extract("Email alice@example.com the report at https://files.example.com/q3.pdf") {
		fmt.Println(v)
	}
	// Output:
	// Email alice@example.com the report at https://files.example.com/q3.pdf
	// https://files.example.com/q3.pdf
	// files.example.com
	// q3.pdf
	// Email
	// alice@example.com
	// alice
	// example
	// report
	// https
	// files
}
