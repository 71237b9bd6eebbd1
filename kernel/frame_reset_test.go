package kernel

import (
	"reflect"
	"testing"
)

// TestResetClearsEveryField sets each field of a frame alone, the owner
// included, and checks that Reset leaves the zero frame: Reset skips the
// pointer fields it finds empty, and a field added to Frame must not be
// one it forgets.
func TestResetClearsEveryField(t *testing.T) {
	typ := reflect.TypeOf(Frame{})
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		var f Frame
		if name == "owner" {
			f.SetOwner(nopOwner{})
		} else {
			v := reflect.ValueOf(&f).Elem().Field(i)
			switch v.Kind() {
			case reflect.String:
				v.SetString("x")
			case reflect.Map:
				v.Set(reflect.MakeMap(v.Type()))
			case reflect.Slice:
				v.Set(reflect.MakeSlice(v.Type(), 1, 1))
			case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
				v.SetUint(1)
			case reflect.Int, reflect.Int32, reflect.Int64:
				v.SetInt(1)
			default:
				t.Fatalf("field %s: kind %v not covered by this test; teach it, and check Reset", name, v.Kind())
			}
		}
		if reflect.ValueOf(f).IsZero() {
			t.Fatalf("field %s: setting it left the frame zero", name)
		}
		f.Reset()
		if !reflect.ValueOf(f).IsZero() {
			t.Errorf("field %s: Reset left %+v", name, f)
		}
	}
}

type nopOwner struct{}

func (nopOwner) ReleaseFrame(*Frame) {}

// Release gives an owned frame back once, clearing its owner, and leaves
// a frame without owner as it is (Frame.Release's comment).
func TestReleaseWithAndWithoutOwner(t *testing.T) {
	f := Frame{Type: FrameRequest, CallID: 3, Method: "Echo.Say", Payload: []byte("x")}
	f.Release()
	if f.Type != FrameRequest || f.CallID != 3 || f.Method != "Echo.Say" || string(f.Payload) != "x" {
		t.Fatalf("Release of a frame without owner changed it: %+v", f)
	}
	var o countingOwner
	f.SetOwner(&o)
	f.Release()
	f.Release()
	if o.n != 1 {
		t.Fatalf("two Releases gave the frame back %d times; want once", o.n)
	}
}

type countingOwner struct{ n int }

func (o *countingOwner) ReleaseFrame(*Frame) { o.n++ }
