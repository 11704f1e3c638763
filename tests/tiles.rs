//! Tiles and index launches: partitions of typed tensors, `task_graph!` loops over a constant
//! bound and over a partition (the pieces written by different iterations run in parallel, and
//! the graph's structure is the run's), the reduction patterns (an `InOut` accumulator the loop
//! orders, a combine that reads every piece), the run-time check of an `IndexLaunch`, and 2-D
//! tiles and inner-axis slices of a matrix (strided pieces) given to typed kernels and host
//! functions, read and written.

mod common;

use common::{Rig, isolated_test};
use simpler::{
    ErrorKind, Orchestrator, Worker, callable, dsl::In, dsl::InOut, dsl::Out, dsl::TensorOf, task_graph,
};

const TILES: u32 = 8;
const ROWS: u32 = 64;

/// `y = k * x` on one chip core.
#[callable(chip, opencl = "kernels/scale.cl", entry = "scale")]
fn scale(x: In<f32>, mut y: Out<f32>, k: f32) {
    for (o, i) in y.iter_mut().zip(x.iter()) {
        *o = k * i;
    }
}

/// `y = k * x` on a SUB worker.
#[callable(sub)]
fn scale_sub(x: In<f32>, mut y: Out<f32>, k: f32) {
    for (o, i) in y.iter_mut().zip(x.iter()) {
        *o = k * i;
    }
}

/// `acc[j] += x[j]` on a SUB worker.
#[callable(sub)]
fn accumulate(mut acc: InOut<f32>, x: In<f32>) {
    for (a, v) in acc.iter_mut().zip(x.iter()) {
        *a += v;
    }
}

/// `acc = 0`.
#[callable(sub)]
fn zero(mut acc: Out<f32>) {
    acc.fill(0.0);
}

/// `total[0] = sum(parts)`.
#[callable(sub)]
fn sum(parts: In<f32>, mut total: Out<f32>) {
    total[0] = parts.iter().sum();
}

task_graph! {
    /// `y = 2x`, one task per tile over two chips, then the sum of `y` on a SUB worker.
    fn scale_tiles(x: In<f32>, y: Out<f32>, total: Out<f32>) {
        let xs = x.split(TILES);
        let ys = y.split(TILES);
        for i in 0..TILES {
            scale(xs[i], &mut ys[i], 2.0).on(chip(i % 2));
        }
        sum(y, &mut total).on(sub());
    }
}

task_graph! {
    /// The same loop over a partition, with an intermediate per tile and an `InOut`
    /// accumulator that the loop orders.
    fn tile_sums(x: In<f32>, acc: Out<f32>) {
        zero(&mut acc).on(sub());
        for (i, xt) in x.split(TILES) {
            let t = alloc::<f32>([8]);
            scale_sub(xt, &mut t, 1.0).on(sub());
            accumulate(&mut acc, t).on(sub());
        }
    }
}

fn ramp(w: &Worker, n: u32) -> (simpler::Buffer, TensorOf<f32>) {
    let b = w.create_buffer(n as usize * 4).unwrap();
    b.write(0, &(0..n).map(|v| v as f32).collect::<Vec<_>>()).unwrap();
    let t = b.typed::<f32>(&[n]).unwrap();
    (b, t)
}

#[isolated_test]
fn a_loop_over_tiles_runs_in_parallel_over_two_chips_and_matches_its_graph() {
    let mut rig = Rig::new(common::builder().chips(2).sub_workers(1));
    rig.init();
    let (_bx, x) = ramp(&rig, ROWS);
    let (by, mut y) = ramp(&rig, ROWS);
    let (bt, mut total) = ramp(&rig, 1);
    let run = scale_tiles::call(&x, &mut y, &mut total)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    run.wait().unwrap();
    let want: Vec<f32> = (0..ROWS).map(|v| 2.0 * v as f32).collect();
    assert_eq!(by.read::<f32>(0, ROWS as usize).unwrap(), want);
    assert_eq!(bt.read::<f32>(0, 1).unwrap(), vec![want.iter().sum::<f32>()]);

    let dag = run.dag().unwrap();
    let graph = scale_tiles::graph();
    assert!(graph.matches(&dag), "{}\n{}", graph.to_dot(), dag.to_dot());
    // Eight tile tasks with no edge between them, each feeding the sum.
    assert_eq!(graph.graph().node_count(), TILES as usize + 1);
    assert_eq!(graph.graph().edge_count(), TILES as usize);
    for i in 0..TILES {
        assert!(dag.has_edge(i, TILES));
    }
    // The placement computed from the index shows in the export.
    let dot = graph.to_dot();
    assert!(dot.contains("worker 0") && dot.contains("worker 1"), "{dot}");
}

#[isolated_test]
fn an_inout_accumulator_is_ordered_by_the_loop() {
    let mut rig = Rig::new(common::builder().sub_workers(2));
    rig.init();
    let (_bx, x) = ramp(&rig, ROWS);
    let (ba, mut acc) = ramp(&rig, ROWS / TILES);
    let run = tile_sums::call(&x, &mut acc)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    run.wait().unwrap();
    let want: Vec<f32> =
        (0..ROWS / TILES).map(|j| (0..TILES).map(|i| (i * ROWS / TILES + j) as f32).sum()).collect();
    assert_eq!(ba.read::<f32>(0, (ROWS / TILES) as usize).unwrap(), want);
    let graph = tile_sums::graph();
    assert!(graph.matches(&run.dag().unwrap()), "{}", graph.to_dot());
    assert_eq!(graph.graph().node_count(), 1 + 2 * TILES as usize);
}

/// `y = 2x`, one task per tile, the tile count a run-time value.
#[callable(orch)]
fn scale_launch(o: &mut Orchestrator<'_>, x: In<f32>, y: Out<f32>, tiles: u32) -> simpler::Result<()> {
    let (xs, mut ys) = (x.split(tiles)?, y.split(tiles)?);
    let mut launch = o.index_launch();
    for (i, (xt, yt)) in xs.iter().zip(ys.iter_mut()).enumerate() {
        launch.submit(scale::call(xt, yt, 2.0)?, simpler::dsl::chip(i as u32 % 2))?;
    }
    Ok(())
}

/// The same with a piece that overlaps its neighbour's: refused before it is submitted.
#[callable(orch)]
fn overlapping_launch(o: &mut Orchestrator<'_>, x: In<f32>, y: Out<f32>, tiles: u32) -> simpler::Result<()> {
    let xs = x.split(tiles)?;
    let rows = ROWS / tiles;
    let mut launch = o.index_launch();
    for (i, xt) in xs.iter().enumerate() {
        let start = (i as u32 * rows).saturating_sub(1); // one row into the previous piece
        let mut yt = y.rows(start..start + rows)?;
        launch.submit(scale::call(xt, &mut yt, 2.0)?, simpler::dsl::chip(i as u32 % 2))?;
    }
    Ok(())
}

#[isolated_test]
fn an_index_launch_checks_its_pieces_at_run_time() {
    let mut rig = Rig::new(common::builder().chips(2));
    rig.init();
    let (_bx, x) = ramp(&rig, ROWS);
    let (by, mut y) = ramp(&rig, ROWS);
    scale_launch::call(&x, &mut y, 16).unwrap().run(&rig).unwrap();
    let want: Vec<f32> = (0..ROWS).map(|v| 2.0 * v as f32).collect();
    assert_eq!(by.read::<f32>(0, ROWS as usize).unwrap(), want);

    let err = overlapping_launch::call(&x, &mut y, 4).unwrap().run(&rig).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overlap, "{err}");
    let msg = err.message();
    assert!(msg.contains("task 1 of the index launch (`scale` parameter `y`) writes"), "{msg}");
    assert!(msg.contains("task 0 (`scale` parameter `y`) writes"), "{msg}");
    // A split that does not divide says so.
    let err = scale_launch::call(&x, &mut y, 5).unwrap().run(&rig).unwrap_err();
    assert!(err.message().contains("64 rows into 5 equal pieces"), "{err}");
}

/// `total[0] = Σ a + Σ b`.
#[callable(sub)]
fn sum_both(a: In<f32>, b: In<f32>, mut total: Out<f32>) {
    total[0] = a.iter().sum::<f32>() + b.iter().sum::<f32>();
}

task_graph! {
    /// Intermediates with static edges: pieces of `parts` written on two chips, each read by
    /// an accumulation into `acc` (written once before the loop), both read after the loop.
    fn static_edges(x: In<f32>, total: Out<f32>) {
        let parts = alloc::<f32>([ROWS]);
        let acc = alloc::<f32>([ROWS / TILES]);
        zero(&mut acc).on(sub());
        let ps = parts.split(TILES);
        for (i, xt) in x.split(TILES) {
            scale(xt, &mut ps[i], 2.0).on(chip(i % 2));
            accumulate(&mut acc, ps[i]).on(sub());
        }
        sum_both(parts, acc, &mut total).on(sub());
    }
}

#[isolated_test]
fn intermediates_with_static_edges_are_ordered_like_tracked_ones() {
    let mut rig = Rig::new(common::builder().chips(2).sub_workers(2));
    rig.init();
    let (_bx, x) = ramp(&rig, ROWS);
    let (bt, mut total) = ramp(&rig, 1);
    let want = 2.0 * (0..ROWS).map(|v| 2.0 * v as f32).sum::<f32>();
    for _ in 0..20 {
        bt.write(0, &[0.0f32]).unwrap();
        let run = static_edges::call(&x, &mut total)
            .unwrap()
            .submit_with(&rig, simpler::RunOptions::new().capture_dag())
            .unwrap();
        run.wait().unwrap();
        assert_eq!(bt.read::<f32>(0, 1).unwrap(), vec![want]);
        // The edges the engine was given are the ones its rules give: no other edge shows.
        let dag = run.dag().unwrap();
        assert!(static_edges::graph().matches(&dag), "{}", dag.to_dot());
        assert!(
            dag.graph().edge_weights().all(|e| !matches!(e, simpler::trace::EdgeReason::Explicit { .. }))
        );
    }
}

/// Rows per tile of the `tiles` loops: the tile count is the run's.
const TILE: u32 = 16;

task_graph! {
    /// `y = 3x` over tiles of `TILE` rows, as many as the tensors have: each tile scaled on
    /// one of two chips into an intermediate of its own (static edges), copied into its piece
    /// of `y` on a SUB worker; then the sum of `y`.
    fn scale_row_tiles(x: In<f32>, y: Out<f32>, total: Out<f32>) {
        let ys = y.tiles([TILE]);
        for (i, xt) in x.tiles([TILE]) {
            let h = alloc::<f32>([TILE]);
            scale(xt, &mut h, 3.0).on(chip(i % 2));
            scale_sub(h, &mut ys[i], 1.0).on(sub());
        }
        sum(y, &mut total).on(sub());
    }
}

/// `c = a + b` on a SUB worker.
#[callable(sub)]
fn add(a: In<f32>, b: In<f32>, mut c: Out<f32>) {
    for ((o, x), y) in c.iter_mut().zip(a.iter()).zip(b.iter()) {
        *o = x + y;
    }
}

task_graph! {
    /// `z = x + y`, tile by tile: three partitions of one loop.
    fn add_tiles(x: In<f32>, y: In<f32>, z: Out<f32>) {
        let xs = x.tiles([TILE]);
        let ys = y.tiles([TILE]);
        let zs = z.tiles([TILE]);
        for (i, xt) in xs {
            add(xt, ys[i], &mut zs[i]).on(sub());
        }
    }
}

task_graph! {
    /// A range loop over the first four tiles: the tensors need at least four.
    fn first_four(x: In<f32>, y: Out<f32>) {
        let xs = x.tiles([TILE]);
        let ys = y.tiles([TILE]);
        for i in 0..4 {
            scale_sub(xs[i], &mut ys[i], 1.0).on(sub());
        }
    }
}

#[isolated_test]
fn a_tiles_loop_runs_as_many_tasks_as_the_run_has_tiles() {
    let mut rig = Rig::new(common::builder().chips(2).sub_workers(1));
    rig.init();
    // One graph, two runs: 64 rows (4 tiles), then 96 rows (6 tiles).
    for rows in [64u32, 96] {
        let tiles = rows / TILE;
        let (_bx, x) = ramp(&rig, rows);
        let (by, mut y) = ramp(&rig, rows);
        let (bt, mut total) = ramp(&rig, 1);
        let run = scale_row_tiles::call(&x, &mut y, &mut total)
            .unwrap()
            .submit_with(&rig, simpler::RunOptions::new().capture_dag())
            .unwrap();
        run.wait().unwrap();
        let want: Vec<f32> = (0..rows).map(|v| 3.0 * v as f32).collect();
        assert_eq!(by.read::<f32>(0, rows as usize).unwrap(), want);
        assert_eq!(bt.read::<f32>(0, 1).unwrap(), vec![want.iter().sum::<f32>()]);

        let dag = run.dag().unwrap();
        let graph = scale_row_tiles::graph_for(x.shape(), y.shape(), total.shape()).unwrap();
        assert!(graph.matches(&dag), "{}\n{}", graph.to_dot(), dag.to_dot());
        // Two tasks per tile, ordered through the tile's intermediate, and no edge between
        // tiles; each tile's copy feeds the sum. The intermediate's edges are static.
        assert_eq!(graph.graph().node_count(), 2 * tiles as usize + 1);
        assert_eq!(graph.graph().edge_count(), 2 * tiles as usize);
        for i in 0..tiles {
            assert!(dag.has_edge(2 * i, 2 * i + 1));
            assert!(dag.has_edge(2 * i + 1, 2 * tiles));
        }
        assert!(
            dag.graph().edge_weights().all(|e| !matches!(e, simpler::trace::EdgeReason::Explicit { .. }))
        );
        let dot = graph.to_dot();
        assert!(dot.contains("worker 0") && dot.contains("worker 1"), "{dot}");
        // The graph of the other count is not this run's.
        let other = scale_row_tiles::graph_for(&[160 - rows], &[160 - rows], &[1]).unwrap();
        assert!(!other.matches(&dag));
    }
    // A tile that does not divide the tensor: refused before anything is submitted.
    let (_bx, x) = ramp(&rig, 40);
    let (by, mut y) = ramp(&rig, 40);
    let (_bt, mut total) = ramp(&rig, 1);
    let err = scale_row_tiles::call(&x, &mut y, &mut total).unwrap().run(&rig).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("`ys` (`y.tiles([TILE])`)"), "{err}");
    assert!(err.message().contains("does not divide axis 0 of 40 (8 left over)"), "{err}");
    assert_eq!(by.read::<f32>(0, 40).unwrap(), (0..40).map(|v| v as f32).collect::<Vec<_>>());
    let err = scale_row_tiles::graph_for(&[40], &[40], &[1]).unwrap_err();
    assert!(err.message().contains("(8 left over)"), "{err}");
}

#[isolated_test]
fn partitions_of_one_tiles_loop_must_have_as_many_pieces() {
    let mut rig = Rig::new(common::builder().sub_workers(2));
    rig.init();
    let (_bx, x) = ramp(&rig, 64);
    let (_by, y) = ramp(&rig, 64);
    let (bz, mut z) = ramp(&rig, 64);
    let run = add_tiles::call(&x, &y, &mut z)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    run.wait().unwrap();
    assert_eq!(bz.read::<f32>(0, 64).unwrap(), (0..64).map(|v| 2.0 * v as f32).collect::<Vec<_>>());
    let graph = add_tiles::graph_for(&[64], &[64], &[64]).unwrap();
    assert!(graph.matches(&run.dag().unwrap()), "{}", graph.to_dot());
    assert_eq!((graph.graph().node_count(), graph.graph().edge_count()), (4, 0));

    // `y` has 6 tiles where `x` has 4: refused before any task of the graph is submitted.
    let (_by, y) = ramp(&rig, 96);
    bz.write(0, &[-1.0f32; 64]).unwrap();
    let err = add_tiles::call(&x, &y, &mut z).unwrap().run(&rig).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let msg = err.message();
    assert!(msg.contains("task graph `add_tiles`"), "{msg}");
    assert!(msg.contains("runs over the 4 pieces of `xs` (`x.tiles([TILE])`)"), "{msg}");
    assert!(msg.contains("indexes `ys` (`y.tiles([TILE])`), which has 6 pieces"), "{msg}");
    assert_eq!(bz.read::<f32>(0, 64).unwrap(), vec![-1.0; 64], "no task ran");
    let err = add_tiles::graph_for(&[64], &[96], &[64]).unwrap_err();
    assert_eq!(err.message(), msg);
}

#[isolated_test]
fn a_range_loop_needs_as_many_tiles_as_it_indexes() {
    let mut rig = Rig::new(common::builder().sub_workers(2));
    rig.init();
    // 96 rows: six tiles, the first four copied.
    let (_bx, x) = ramp(&rig, 96);
    let (by, mut y) = ramp(&rig, 96);
    by.write(0, &[-1.0f32; 96]).unwrap();
    let run = first_four::call(&x, &mut y)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    run.wait().unwrap();
    let got = by.read::<f32>(0, 96).unwrap();
    assert_eq!(got[..64], (0..64).map(|v| v as f32).collect::<Vec<_>>());
    assert_eq!(got[64..], [-1.0; 32]);
    let graph = first_four::graph_for(x.shape(), y.shape()).unwrap();
    assert!(graph.matches(&run.dag().unwrap()), "{}", graph.to_dot());
    assert_eq!(graph.graph().node_count(), 4);

    // 48 rows: three tiles, refused before any task is submitted.
    let (_bx, x) = ramp(&rig, 48);
    let (by, mut y) = ramp(&rig, 48);
    by.write(0, &[-1.0f32; 48]).unwrap();
    let err = first_four::call(&x, &mut y).unwrap().run(&rig).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let msg = err.message();
    assert!(msg.contains("task graph `first_four`"), "{msg}");
    assert!(msg.contains("runs up to index 3 and indexes `xs` (`x.tiles([TILE])`) at its index, but `xs` (`x.tiles([TILE])`) has 3 pieces"), "{msg}");
    assert_eq!(by.read::<f32>(0, 48).unwrap(), vec![-1.0; 48], "no task ran");
    assert_eq!(first_four::graph_for(&[48], &[48]).unwrap_err().message(), msg);
}

/// Rows and columns of the matrices the 2-D tests cut: `grid([2, 3])` and `tiles([4, 4])` give
/// six 4x4 tiles, each a strided piece (rows 12 elements apart).
const MR: u32 = 8;
const MC: u32 = 12;

/// `y[(r, c)] = x[(r, c)] + 1000 r` over a tile, `r` the tile's own row, on one chip core.
#[callable(chip, opencl = "kernels/tile_rows.cl", entry = "tile_rows")]
fn tile_rows(x: In<f32>, mut y: Out<f32>, cols: u32) {
    assert_eq!((x.shape(), y.shape()[1]), (y.shape(), cols), "tile shapes");
    for r in 0..y.shape()[0] as usize {
        for c in 0..cols as usize {
            y[(r, c)] = x[(r, c)] + 1000.0 * r as f32;
        }
    }
}

/// `tile_rows` on a SUB worker, through the rows.
#[callable(sub)]
fn tile_rows_sub(x: In<f32>, mut y: Out<f32>, cols: u32) {
    assert_eq!((x.shape(), y.shape()[1]), (y.shape(), cols), "tile shapes");
    for (r, (yr, xr)) in y.rows_mut().zip(x.rows()).enumerate() {
        for (o, v) in yr.iter_mut().zip(xr) {
            *o = v + 1000.0 * r as f32;
        }
    }
}

/// `y[(r, c)] += 1000 r + c` over a tile, in place, on one chip core.
#[callable(chip, opencl = "kernels/tile_bump.cl", entry = "tile_bump")]
fn tile_bump(mut y: InOut<f32>, cols: u32) {
    assert_eq!(y.shape()[1], cols, "tile shape");
    for r in 0..y.shape()[0] as usize {
        for c in 0..cols as usize {
            y[(r, c)] += (1000 * r + c) as f32;
        }
    }
}

/// `tile_bump` on a SUB worker.
#[callable(sub)]
fn tile_bump_sub(mut y: InOut<f32>, cols: u32) {
    assert_eq!(y.shape()[1], cols, "tile shape");
    for (r, row) in y.rows_mut().enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            *v += (1000 * r + c) as f32;
        }
    }
}

task_graph! {
    /// 2-D tiles on chips: `y` from `x` tile by tile (`grid`), `z` bumped in place (`tiles`).
    fn chip_tiles_2d(x: In<f32>, y: Out<f32>, z: InOut<f32>) {
        let xs = x.grid([2, 3]);
        let ys = y.grid([2, 3]);
        for i in 0..6 {
            tile_rows(xs[i], &mut ys[i], 4).on(chip(i % 2));
        }
        let zs = z.tiles([4, 4]);
        for i in 0..6 {
            tile_bump(&mut zs[i], 4).on(chip(i % 2));
        }
    }
}

task_graph! {
    /// The same on SUB workers.
    fn sub_tiles_2d(x: In<f32>, y: Out<f32>, z: InOut<f32>) {
        let xs = x.tiles([4, 4]);
        let ys = y.tiles([4, 4]);
        for (i, xt) in xs {
            tile_rows_sub(xt, &mut ys[i], 4).on(sub());
        }
        let zs = z.grid([2, 3]);
        for i in 0..6 {
            tile_bump_sub(&mut zs[i], 4).on(sub());
        }
    }
}

/// Inner-axis slices (column halves of the matrices, strided pieces), through the typed API:
/// `y` from `x` and `z` bumped, each half on one chip (`on_chip`) or on a SUB worker.
#[callable(orch)]
fn column_halves(
    o: &mut Orchestrator<'_>,
    x: In<f32>,
    y: Out<f32>,
    z: InOut<f32>,
    on_chip: u32,
) -> simpler::Result<()> {
    let half = MC / 2;
    for h in 0..2 {
        let cols = h * half..(h + 1) * half;
        let xt = x.slice(1, cols.clone())?;
        let (mut yt, mut zt) = (y.slice(1, cols.clone())?, z.slice(1, cols)?);
        if on_chip == 1 {
            tile_rows::call(&xt, &mut yt, half)?.on(o, simpler::dsl::chip(h))?;
            tile_bump::call(&mut zt, half)?.on(o, simpler::dsl::chip(h))?;
        } else {
            tile_rows_sub::call(&xt, &mut yt, half)?.on(o, simpler::dsl::sub())?;
            tile_bump_sub::call(&mut zt, half)?.on(o, simpler::dsl::sub())?;
        }
    }
    Ok(())
}

/// Three `MR` x `MC` matrices: `x` a ramp, `y` a sentinel (-1), `z` a ramp from 0.5.
fn matrices(w: &Worker) -> [(simpler::Buffer, TensorOf<f32>); 3] {
    let n = (MR * MC) as usize;
    [(0.0, 1.0), (-1.0, 0.0), (0.5, 1.0)].map(|(at, step)| {
        let b = w.create_buffer(n * 4).unwrap();
        b.write(0, &(0..n).map(|v| at + step * v as f32).collect::<Vec<_>>()).unwrap();
        let t = b.typed::<f32>(&[MR, MC]).unwrap();
        (b, t)
    })
}

/// Checks `y` and `z` element by element against the host's computation, for tiles of
/// `tile_rows` rows and `tile_cols` columns.
fn check_tiles(y: &simpler::Buffer, z: &simpler::Buffer, tile_rows: u32, tile_cols: u32) {
    let n = (MR * MC) as usize;
    let (y, z) = (y.read::<f32>(0, n).unwrap(), z.read::<f32>(0, n).unwrap());
    for r in 0..MR {
        for c in 0..MC {
            let (i, tr, tc) = ((r * MC + c) as usize, r % tile_rows, c % tile_cols);
            assert_eq!(y[i], i as f32 + 1000.0 * tr as f32, "y[({r}, {c})]");
            assert_eq!(z[i], 0.5 + i as f32 + (1000 * tr + tc) as f32, "z[({r}, {c})]");
        }
    }
}

#[isolated_test]
fn two_d_tiles_reach_typed_chip_kernels_and_host_functions() {
    let mut rig = Rig::new(common::builder().chips(2).sub_workers(2));
    rig.init();
    let [(_bx, x), (by, mut y), (bz, mut z)] = matrices(&rig);
    chip_tiles_2d::call(&x, &mut y, &mut z).unwrap().run(&rig).unwrap();
    check_tiles(&by, &bz, 4, 4);

    let [(_bx, x), (by, mut y), (bz, mut z)] = matrices(&rig);
    sub_tiles_2d::call(&x, &mut y, &mut z).unwrap().run(&rig).unwrap();
    check_tiles(&by, &bz, 4, 4);
}

#[isolated_test]
fn inner_axis_slices_reach_typed_chip_kernels_and_host_functions() {
    let mut rig = Rig::new(common::builder().chips(2).sub_workers(2));
    rig.init();
    for on_chip in [1, 0] {
        let [(_bx, x), (by, mut y), (bz, mut z)] = matrices(&rig);
        column_halves::call(&x, &mut y, &mut z, on_chip).unwrap().run(&rig).unwrap();
        check_tiles(&by, &bz, MR, MC / 2);
    }
}

task_graph! {
    /// 2-D tiles of an intermediate whose tasks all run on chip 0: written tile by tile from
    /// `x`, then read tile by tile into `y`. Cut into strided pieces, it stays in host memory
    /// (not the chip's), so the chip packs each piece for every backend's kernels.
    fn device_tiles_2d(x: In<f32>, y: Out<f32>, z: InOut<f32>) {
        let h = alloc::<f32>([MR, MC]);
        let hs = h.grid([2, 3]);
        let xs = x.grid([2, 3]);
        for i in 0..6 {
            tile_rows(xs[i], &mut hs[i], 4).on(chip(0));
        }
        let ys = y.grid([2, 3]);
        for i in 0..6 {
            tile_rows(hs[i], &mut ys[i], 4).on(chip(0));
        }
        let zs = z.grid([2, 3]);
        for i in 0..6 {
            tile_bump(&mut zs[i], 4).on(chip(0));
        }
    }
}

#[isolated_test]
fn two_d_tiles_of_an_intermediate_used_on_one_chip_reach_typed_kernels() {
    let mut rig = Rig::new(common::builder().chips(1));
    rig.init();
    let [(_bx, x), (by, mut y), (bz, mut z)] = matrices(&rig);
    device_tiles_2d::call(&x, &mut y, &mut z).unwrap().run(&rig).unwrap();
    // Each tile went through `tile_rows` twice: 2000 per tile row.
    let n = (MR * MC) as usize;
    let yv = by.read::<f32>(0, n).unwrap();
    for (i, v) in yv.iter().enumerate() {
        assert_eq!(*v, i as f32 + 2000.0 * ((i / MC as usize) % 4) as f32, "y[{i}]");
    }
    let zv = bz.read::<f32>(0, n).unwrap();
    for (i, v) in zv.iter().enumerate() {
        let (r, c) = (i / MC as usize, i % MC as usize);
        assert_eq!(*v, 0.5 + i as f32 + (1000 * (r % 4) + c % 4) as f32, "z[{i}]");
    }
}

task_graph! {
    /// Affine indices: the even pieces of `y` take the first half of `x` doubled, the odd
    /// pieces its second half tripled (`ys[2 * i]`, `ys[2 * i + 1]`, `xs[i + 4]`); no two
    /// iterations write one piece, so all eight tasks run in parallel.
    fn interleave(x: In<f32>, y: Out<f32>) {
        let xs = x.split(TILES);
        let ys = y.split(TILES);
        for i in 0..TILES / 2 {
            scale_sub(xs[i], &mut ys[2 * i], 2.0).on(sub());
            scale_sub(xs[i + 4], &mut ys[2 * i + 1], 3.0).on(sub());
        }
    }
}

#[isolated_test]
fn affine_indices_interleave_pieces_in_parallel_and_match_the_graph() {
    let mut rig = Rig::new(common::builder().sub_workers(2));
    rig.init();
    let (_bx, x) = ramp(&rig, ROWS);
    let (by, mut y) = ramp(&rig, ROWS);
    by.write(0, &[-1.0f32; ROWS as usize]).unwrap();
    let run = interleave::call(&x, &mut y)
        .unwrap()
        .submit_with(&rig, simpler::RunOptions::new().capture_dag())
        .unwrap();
    run.wait().unwrap();
    let rows = ROWS / TILES; // per piece
    let want: Vec<f32> = (0..ROWS)
        .map(|r| {
            let (piece, at) = (r / rows, r % rows);
            let (k, src) = (piece / 2, piece % 2);
            let x = ((k + src * TILES / 2) * rows + at) as f32;
            if src == 0 { 2.0 * x } else { 3.0 * x }
        })
        .collect();
    assert_eq!(by.read::<f32>(0, ROWS as usize).unwrap(), want);
    let graph = interleave::graph();
    assert!(graph.matches(&run.dag().unwrap()), "{}", graph.to_dot());
    assert_eq!(graph.graph().node_count(), TILES as usize);
    assert_eq!(graph.graph().edge_count(), 0, "the pieces are disjoint: {}", graph.to_dot());
}

task_graph! {
    /// A range loop naming the odd tiles 1, 3, 5, 7 of `y`: it needs at least eight.
    fn odd_tiles(x: In<f32>, y: Out<f32>) {
        let xs = x.tiles([TILE]);
        let ys = y.tiles([TILE]);
        for i in 0..4 {
            scale_sub(xs[i], &mut ys[2 * i + 1], 1.0).on(sub());
        }
    }
}

#[isolated_test]
fn an_affine_index_into_tiles_is_checked_before_anything_runs() {
    let mut rig = Rig::new(common::builder().sub_workers(2));
    rig.init();
    // x: four tiles; y: eight, its odd ones written.
    let (_bx, x) = ramp(&rig, 4 * TILE);
    let (by, mut y) = ramp(&rig, 8 * TILE);
    by.write(0, &[-1.0f32; 8 * TILE as usize]).unwrap();
    odd_tiles::call(&x, &mut y).unwrap().run(&rig).unwrap();
    let got = by.read::<f32>(0, 8 * TILE as usize).unwrap();
    for (t, tile) in got.chunks(TILE as usize).enumerate() {
        let t = t as u32;
        let want: Vec<f32> = match t % 2 {
            1 => ((t / 2) * TILE..(t / 2 + 1) * TILE).map(|v| v as f32).collect(),
            _ => vec![-1.0; TILE as usize],
        };
        assert_eq!(tile, want, "tile {t}");
    }
    // y with seven tiles: piece 7 does not exist; refused before any task is submitted.
    let (by, mut y) = ramp(&rig, 7 * TILE);
    by.write(0, &[-1.0f32; 7 * TILE as usize]).unwrap();
    let err = odd_tiles::call(&x, &mut y).unwrap().run(&rig).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let msg = err.message();
    assert!(msg.contains("task graph `odd_tiles`"), "{msg}");
    assert!(msg.contains("runs over 0..4 and indexes `ys` (`y.tiles([TILE])`) at `2*i+1`, pieces 1 to 7, but `ys` (`y.tiles([TILE])`) has 7 pieces"), "{msg}");
    assert_eq!(by.read::<f32>(0, 7 * TILE as usize).unwrap(), vec![-1.0; 7 * TILE as usize], "no task ran");
}
