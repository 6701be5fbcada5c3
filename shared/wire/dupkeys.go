package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"unicode"
)

// duplicateKey reports the first object key in body that repeats an earlier
// key of the same object, as encoding/json would see it when decoding into a
// value of type t. Keys of an object decoded into a struct are compared
// case-insensitively, as encoding/json matches field names, so that
// {"worker_id": "a", "WORKER_ID": "b"} cannot decode silently as "b" while a
// proxy or a log that reads the first key disagrees about which worker the
// request names. Keys of a map (env, tags) or of free JSON (result_blob) are
// compared exactly: PATH and path are two environment variables.
//
// It reports "" for a body without repeats, and for one that is not JSON
// (Decode then says what is wrong with it).
func duplicateKey(body []byte, t reflect.Type) string {
	type frame struct {
		typ       reflect.Type // what this container decodes into; nil: free JSON
		object    bool
		expectKey bool
		next      reflect.Type // the type of the value after the current key
		keys      map[string]struct{}
	}
	stack := []frame{{next: t}} // a pseudo-frame holding the top-level type
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		top := &stack[len(stack)-1]
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				typ := deref(top.next)
				if top.object {
					top.expectKey = true // this container is the key's value
				}
				f := frame{typ: typ, object: d == '{', expectKey: d == '{', keys: map[string]struct{}{}}
				if d == '[' {
					f.next = elem(typ)
				}
				stack = append(stack, f)
			default:
				stack = stack[:len(stack)-1]
				if len(stack) == 1 {
					return ""
				}
			}
			continue
		}
		if !top.object {
			continue // an array element or the top-level scalar
		}
		if !top.expectKey {
			top.expectKey = true // a scalar value
			continue
		}
		key := tok.(string)
		k := key
		if top.typ != nil && top.typ.Kind() == reflect.Struct {
			k = foldKey(key)
		}
		if _, dup := top.keys[k]; dup {
			return key
		}
		top.keys[k] = struct{}{}
		top.expectKey = false
		top.next = valueType(top.typ, key)
	}
}

// deref strips pointers; nil stays nil.
func deref(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// elem is the element type of a slice or array type, else nil.
func elem(t reflect.Type) reflect.Type {
	t = deref(t)
	if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		return t.Elem()
	}
	return nil
}

// valueType is the type the value under key decodes into in an object of
// type t: a map's element, a struct's field (matched as encoding/json
// matches it), or nil for free JSON (json.RawMessage, any).
func valueType(t reflect.Type, key string) reflect.Type {
	t = deref(t)
	if t == nil {
		return nil
	}
	switch t.Kind() {
	case reflect.Map:
		return deref(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			if strings.EqualFold(name, key) {
				ft := deref(f.Type)
				if ft == reflect.TypeFor[json.RawMessage]() {
					return nil
				}
				return ft
			}
		}
	}
	return nil
}

// foldKey maps s to one representative of its case-folding class, so that
// foldKey(a) == foldKey(b) exactly when strings.EqualFold(a, b): each rune
// becomes the smallest rune of its simple-folding orbit (k, K and the
// Kelvin sign all become K).
func foldKey(s string) string {
	var b strings.Builder
	for _, r := range s {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}
