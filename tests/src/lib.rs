//! Integration tests of devarena live in `tests/`.
