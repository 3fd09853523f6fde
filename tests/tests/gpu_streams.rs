//! An arena's views on another stream than the arena's: ordered both ways.

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_tests_need_the_cuda_feature() {
    devarena_tests::skip_or_fail("built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
mod gpu {
    use devarena::backend::cuda::CudaBackend;
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
}
