package plugintest

import (
	"reflect"
	"testing"
)

// codecFillKinds has a field of every kind codecFill sets, and some it
// must leave alone.
type codecFillKinds struct {
	S      string
	B      bool
	I      int8
	U      uint16
	F      float32
	Bytes  []byte
	List   []string
	ByStr  map[string]int
	ByInt  map[int64]string
	ByUint map[uint8]bool
	Arr    [2]int
	Ptr    *codecFillKinds
	Chain  *codecFillChain

	ByFloat map[float64]int // a key kind it does not make: left nil
	Func    func()          // no value to give: left nil
	hidden  int             // unexported: left as it was
}

type codecFillChain struct {
	Next *codecFillChain
	N    int
}

// codecFill gives every exported field a value other than its zero one,
// so that the Reuse check sees a codec that merges into it, and stops at
// a depth rather than following a chain of pointers for ever.
func TestCodecFillSetsEveryKind(t *testing.T) {
	v := codecFillKinds{hidden: 1}
	if !codecFill(reflect.ValueOf(&v), 0) {
		t.Fatal("codecFill reported nothing set")
	}
	rv := reflect.ValueOf(v)
	for i := range rv.NumField() {
		f, name := rv.Field(i), rv.Type().Field(i).Name
		switch name {
		case "ByFloat", "Func":
			if !f.IsZero() {
				t.Errorf("%s was set to %v; want it left alone", name, f)
			}
		case "hidden":
			if v.hidden != 1 {
				t.Errorf("the unexported field was changed to %d", v.hidden)
			}
		default:
			if f.IsZero() {
				t.Errorf("%s was left at its zero value", name)
			}
		}
	}
	if v.ByInt[77] != codecStale || !v.ByUint[77] || v.ByStr[codecStale] != 7 || v.Arr != [2]int{7, 7} {
		t.Errorf("maps and arrays hold %v %v %v %v; want the fill values", v.ByInt, v.ByUint, v.ByStr, v.Arr)
	}
	depth := 0
	for c := v.Chain; c != nil; c = c.Next {
		depth++
	}
	if depth == 0 || depth > 5 {
		t.Errorf("a chain of pointers was filled %d deep; want a bounded, non-zero depth", depth)
	}
}
