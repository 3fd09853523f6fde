// A growable pool hands out memory inside a `VirtualMemory`'s reservation as `&mut [T]` on the
// host; an implementation that lied about what it mapped would let safe code write memory no
// one owns. `VirtualMemory` is an `unsafe trait`: a safe impl does not compile.

use devarena::Error;
use devarena::backend::{MemoryKind, VirtualMemory};

struct Liar;

impl VirtualMemory for Liar {
    fn name(&self) -> &'static str {
        "liar"
    }
    fn memory(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn granularity(&self) -> usize {
        4096
    }
    fn reserve(&self, _bytes: usize) -> Result<u64, Error> {
        Ok(4096) // an address no one reserved
    }
    unsafe fn free_reservation(&self, _base: u64, _bytes: usize) -> Result<(), Error> {
        Ok(())
    }
    unsafe fn map(&self, _addr: u64, _chunk: usize, _count: usize) -> Result<(), Error> {
        Ok(()) // maps nothing, says it did
    }
    unsafe fn unmap(&self, _addr: u64, _chunk: usize) -> Result<(), Error> {
        Ok(())
    }
}

fn main() {}
