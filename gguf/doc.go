// Package gguf reads and writes GGUF files, the model format of llama.cpp.
//
// Open maps a file (or every part of a split model, given its first part
// NAME-00001-of-0000N.gguf) and presents its metadata and tensors; tensor
// data are views into the mapping, so opening a model of any size costs
// only its header. Parse does the same for bytes already in memory. GGUF
// versions 1 to 3 and every metadata type, arrays of arrays included, are
// read; the writer (Writer, WriteSplit, File.WriteTo) writes versions 2
// and 3 and reproduces files written by llama.cpp byte for byte.
//
// Malformed input never panics: every problem is a *ParseError naming the
// file, the byte offset and the field that was wrong, and every count and
// length is checked against the bytes that remain before anything is
// allocated, so memory stays proportional to the input.
//
// The ggml type table (block sizes and bytes per block) lives here too;
// the kernels and the GPU backend use it.
package gguf
