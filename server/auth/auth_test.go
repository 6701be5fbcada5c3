package auth

import (
	"net/http/httptest"
	"testing"
)

func TestWorkerToken(t *testing.T) {
	const id = "wrk_01ARZ3NDEKTSV4RRFFQ69G5FAV"
	tok, hash, err := NewWorkerToken(id)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := WorkerOf(tok); !ok || got != id {
		t.Fatalf("WorkerOf(%q) = %q, %v", tok, got, ok)
	}
	if !HashMatches(tok, hash) {
		t.Fatal("token does not match its own hash")
	}
	if HashMatches(tok+"x", hash) || HashMatches(tok, "") {
		t.Fatal("wrong token or empty hash matched")
	}
	other, _, _ := NewWorkerToken(id)
	if other == tok {
		t.Fatal("two tokens for one worker are equal")
	}
}

func TestWorkerOfRejects(t *testing.T) {
	for _, tok := range []string{"", "wtk_", "wtk_abc", "wtk__secret", "wtk_abc_", "op_abc_def", "Bearer x"} {
		if _, ok := WorkerOf(tok); ok {
			t.Errorf("WorkerOf(%q) accepted", tok)
		}
	}
}

func TestEqual(t *testing.T) {
	cases := []struct {
		name, got, want string
		eq              bool
	}{
		{"same", "abc", "abc", true},
		{"differs", "abd", "abc", false},
		{"prefix", "ab", "abc", false},
		{"empty want never matches", "", "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if Equal(c.got, c.want) != c.eq {
				t.Fatalf("Equal(%q, %q) != %v", c.got, c.want, c.eq)
			}
		})
	}
}

func TestBearer(t *testing.T) {
	cases := map[string]string{"Bearer abc": "abc", "bearer abc": "abc", "Basic abc": "", "": "", "Bearer": ""}
	for header, want := range cases {
		r := httptest.NewRequest("GET", "/", nil)
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		if got := Bearer(r); got != want {
			t.Errorf("Bearer(%q) = %q, want %q", header, got, want)
		}
	}
}
