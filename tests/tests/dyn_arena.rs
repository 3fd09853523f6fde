//! The arena of a run-time layout: one allocation, views by name, checked at run time.

use devarena::{DynArena, Error, HostBackend, LayoutBuilder};

#[test]
fn runtime_layout_one_allocation_and_intact_views() {
    let n = 1000 + (std::process::id() as usize % 7); // a size the compiler cannot know
    let layout = LayoutBuilder::new("Runtime")
        .array::<u8>("bytes", n)
        .array::<f32>("floats", n)
        .array_aligned::<u32>("words", n, 4096)
        .build()
        .unwrap();
    let backend = HostBackend::new();
    {
        let mut arena = DynArena::new_in(layout.clone(), backend.clone()).unwrap();
        assert_eq!(arena.addr() % 4096, 0);
        {
            let [bytes] = arena.views_mut::<u8, 1>(["bytes"]).unwrap();
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = i as u8;
            }
        }
        {
            let [a, b] = arena.views_mut::<u32, 2>(["floats", "words"]).unwrap();
            a.fill(7);
            b.fill(9);
            assert_eq!((a.len(), b.len()), (n, n));
        }
        let bytes = arena.view::<u8>("bytes").unwrap();
        assert!(bytes.iter().enumerate().all(|(i, &b)| b == i as u8));
        assert!(arena.view::<u32>("floats").unwrap().iter().all(|&x| x == 7));
        assert!(arena.view::<u32>("words").unwrap().iter().all(|&x| x == 9));
        let words = layout.field("words").unwrap();
        assert_eq!(
            arena.view::<u32>("words").unwrap().as_ptr() as u64,
            arena.addr() + words.offset as u64
        );
    }
    let stats = backend.stats();
    assert_eq!((stats.allocations, stats.frees), (1, 1));
}

#[test]
fn runtime_checks_name_the_problem() {
    // `head` aligned to 4 makes the allocation 4-aligned, so `tail` at offset 3 is misaligned
    // for u32 wherever the allocator puts it (under Miri, an allocation aligned to 1 may start
    // anywhere, and `tail` was 4-aligned in some runs).
    let layout = LayoutBuilder::new("Odd")
        .align(1)
        .array_aligned::<u8>("head", 3, 4)
        .array::<u8>("tail", 12)
        .build()
        .unwrap();
    let mut arena = DynArena::new(layout).unwrap();
    let msg = |e: Error| e.to_string();
    // `tail` starts at byte 3: not aligned for u32.
    let e = msg(arena.view_mut::<u32>("tail").unwrap_err());
    assert!(
        e.contains("tail") && e.contains("offset 3") && e.contains("4 bytes"),
        "{e}"
    );
    // 12 bytes are not whole 5-byte elements.
    let e = msg(arena.view_mut::<[u8; 5]>("tail").unwrap_err());
    assert!(e.contains("12 bytes") && e.contains("5 bytes each"), "{e}");
    let e = msg(arena.view::<u8>("missing").unwrap_err());
    assert!(e.contains("no field `missing`"), "{e}");
    let e = msg(arena.views_mut::<u8, 2>(["head", "head"]).unwrap_err());
    assert!(e.contains("`head` and `head`"), "{e}");
}

#[test]
fn fields_sharing_bytes_are_not_borrowed_together() {
    let layout = LayoutBuilder::new("Staged")
        .stages(2)
        .array::<f32>("first", 1024)
        .live(0, 0)
        .array::<f32>("second", 1024)
        .live(1, 1)
        .array::<f32>("both", 16)
        .build()
        .unwrap();
    let first = layout.field("first").unwrap().offset;
    let second = layout.field("second").unwrap().offset;
    assert_eq!(first, second, "stage-disjoint fields share bytes");
    let mut arena = DynArena::new(layout).unwrap();
    let e = arena
        .views_mut::<f32, 2>(["first", "second"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("share bytes"), "{e}");
    let [a, b] = arena.views_mut::<f32, 2>(["first", "both"]).unwrap();
    a.fill(1.0);
    b.fill(2.0);
    assert!(a.iter().all(|&x| x == 1.0));
}

#[test]
fn backend_counts_are_shared_with_clones() {
    let backend = HostBackend::new();
    let layout = LayoutBuilder::new("L")
        .array::<u8>("a", 10)
        .build()
        .unwrap();
    let a = DynArena::new_in(layout.clone(), backend.clone()).unwrap();
    let b = DynArena::new_in(layout, backend.clone()).unwrap();
    assert_eq!(backend.stats().live_allocations(), 2);
    assert_ne!(a.addr(), b.addr());
}
