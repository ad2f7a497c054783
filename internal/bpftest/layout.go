package bpftest

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// StructLayout checks that the Go mirror goVal of the C struct cName in
// spec's BTF has its size and, member by member, the same offsets and
// sizes: a value the agent writes is one the program reads.
func StructLayout(spec *ebpf.CollectionSpec, cName string, goVal any) error {
	var st *btf.Struct
	if err := spec.Types.TypeByName(cName, &st); err != nil {
		return fmt.Errorf("struct %s: %w", cName, err)
	}
	goType := reflect.TypeOf(goVal)
	if size, _ := btf.Sizeof(st); size != int(goType.Size()) {
		return fmt.Errorf("struct %s is %d bytes, %s is %d", cName, size, goType, goType.Size())
	}
	if len(st.Members) != goType.NumField() {
		return fmt.Errorf("struct %s has %d members, %s has %d fields", cName, len(st.Members), goType, goType.NumField())
	}
	var errs []error
	for i, m := range st.Members {
		f := goType.Field(i)
		size, _ := btf.Sizeof(m.Type)
		if int(m.Offset.Bytes()) != int(f.Offset) || size != int(f.Type.Size()) {
			errs = append(errs, fmt.Errorf("%s.%s at %d (%d bytes), %s.%s at %d (%d bytes)",
				cName, m.Name, m.Offset.Bytes(), size, goType, f.Name, f.Offset, f.Type.Size()))
		}
	}
	return errors.Join(errs...)
}

// MapLayout checks that map name of spec has the key and value sizes of
// the Go types of key and value.
func MapLayout(spec *ebpf.CollectionSpec, name string, key, value any) error {
	ms, ok := spec.Maps[name]
	if !ok {
		return fmt.Errorf("no map %s", name)
	}
	k, v := reflect.TypeOf(key), reflect.TypeOf(value)
	if int(ms.KeySize) != int(k.Size()) || int(ms.ValueSize) != int(v.Size()) {
		return fmt.Errorf("map %s: key %d, value %d bytes; Go %s %d, %s %d", name, ms.KeySize, ms.ValueSize, k, k.Size(), v, v.Size())
	}
	return nil
}

// Struct is a C struct's name and a value of its Go mirror.
type Struct struct {
	C  string
	Go any
}

// Map is a map's name and values of its key's and value's Go types.
type Map struct {
	Name       string
	Key, Value any
}

// CheckLayouts checks every struct (StructLayout) and map (MapLayout) in
// each of specs, by object name: objects that share pinned maps must all
// agree with the Go side.
func CheckLayouts(t testing.TB, specs map[string]*ebpf.CollectionSpec, structs []Struct, mapTypes []Map) {
	t.Helper()
	for _, obj := range slices.Sorted(maps.Keys(specs)) {
		spec := specs[obj]
		for _, s := range structs {
			if err := StructLayout(spec, s.C, s.Go); err != nil {
				t.Errorf("%s: %v", obj, err)
			}
		}
		for _, m := range mapTypes {
			if err := MapLayout(spec, m.Name, m.Key, m.Value); err != nil {
				t.Errorf("%s: %v", obj, err)
			}
		}
	}
}
