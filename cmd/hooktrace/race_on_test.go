//go:build race

package main

// raceBuild: the tests were built with -race, so the hooktrace binary they
// run is too, and a data race in it fails the test that triggers it.
const raceBuild = true
