// Arenas order other streams' work with an arena's, and capture it, on the stream a
// `StreamOrdered` backend names: a wrong stream would let that work race with the arena's. The
// trait is `unsafe`: a safe impl does not compile.
#![forbid(unsafe_code)]

use std::sync::Arc;

use devarena::backend::cuda::{CudaBackend, CudaStream, StreamOrdered};

struct Elsewhere {
    inner: CudaBackend,
    other: Arc<CudaStream>,
}

impl StreamOrdered for Elsewhere {
    fn stream(&self) -> &Arc<CudaStream> {
        let _ = &self.inner;
        &self.other
    }
}

fn main() {}
