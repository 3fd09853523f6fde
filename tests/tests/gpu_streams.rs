//! An arena's views on another stream than the arena's: ordered both ways.

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_tests_need_the_cuda_feature() {
    devarena_tests::skip_or_fail("built without the `cuda` feature");
}

// The stream gate of the pool's GPU tests (a host function that holds a stream).
#[cfg(feature = "cuda")]
#[path = "../../allocator/tests/gpu_common/mod.rs"]
mod gpu_common;

#[cfg(feature = "cuda")]
mod gpu {
    use std::time::Duration;

    use devarena::backend::cuda::{CudaBackend, ManagedBackend};
    use devarena::{Arena, DeviceLayout};
    use devarena_tests::gpu_stream;

    #[derive(DeviceLayout)]
    struct Big {
        data: [u32; 1 << 24],
        #[layout(align = 4096)]
        flag: [u32; 1],
    }

    #[test]
    fn views_for_another_stream_are_ordered_both_ways() {
        let Some(stream) = gpu_stream() else { return };
        let other = stream.context().new_stream().unwrap();
        let mut arena = Arena::<Big, _>::new_in(CudaBackend::new(stream.clone())).unwrap();
        for round in 1..=4u8 {
            // 64 MiB queued on the arena's stream, then 64 MiB on the other stream: the second
            // must run after the first, and the download on the arena's stream after both.
            arena.views_mut().data.fill_bytes(round).unwrap();
            {
                let mut on = arena.views_mut_on(&other).unwrap();
                assert_eq!(on.data.stream().cu_stream(), other.cu_stream());
                on.data.fill_bytes(round.wrapping_mul(16)).unwrap();
                on.flag.fill_bytes(round).unwrap();
            }
            let data = arena.views().data.to_vec().unwrap();
            let want = u32::from_ne_bytes([round.wrapping_mul(16); 4]);
            assert!(
                data.iter().all(|&x| x == want),
                "round {round}: bytes queued on the other stream were not all seen in order"
            );
            assert_eq!(
                arena.views().flag.to_vec().unwrap(),
                [u32::from_ne_bytes([round; 4])]
            );
        }
    }

    /// Views made for another stream are handed back by dropping their guard (`OnStream`),
    /// which makes the arena's stream wait for that stream. Leaking the guard is safe code
    /// (`mem::forget`), and then nothing orders the arena after the other stream: a managed
    /// arena's host views wait only for the arena's own stream, so the host reads (and could
    /// write) bytes a memset queued on the other stream has not written yet: a data race
    /// between the host and the device from safe code. (A stream-ordered arena dropped instead
    /// is freed with `cuMemFreeAsync` on its stream, unordered after the memset: a
    /// use-after-free.) The other stream is held by a gate, opened 200 ms later from another
    /// thread, so the outcome does not depend on timing: the host must see every byte of the
    /// memset.
    #[test]
    #[ignore = "views_mut_on relies on its guard's drop for ordering; the fix needs an API \
                decision (a scoped closure API, or the arena remembering the streams it lent \
                views to and waiting for them before host views and before its free)"]
    fn a_leaked_guard_of_views_on_another_stream_still_orders_the_host_views() {
        let Some((_device, stream)) = super::gpu_common::gpu() else {
            return;
        };
        let other = stream.context().new_stream().unwrap();
        let mut arena = Arena::<Big, _>::new_in(ManagedBackend::new(stream.clone())).unwrap();
        arena.host_views_mut().unwrap().data.fill(0);
        let gate = super::gpu_common::StreamGate::block(&other);
        let mut on = arena.views_mut_on(&other).unwrap();
        on.data.fill_bytes(0x5a).unwrap(); // queued behind the gate
        std::mem::forget(on);
        let opener = gate.opener();
        let open_later = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            opener.open();
        });
        let host = arena.host_views().unwrap();
        let stale = host.data.iter().filter(|&&x| x != 0x5a5a_5a5a).count();
        open_later.join().unwrap();
        drop(gate);
        assert_eq!(
            stale, 0,
            "the host views were handed out before the memset queued on the other stream ran \
             ({stale} words not written yet)"
        );
    }
}
