//! Index launches with a bound known only at run time: [`IndexLaunch`] submits typed calls like
//! [`Call::on`] and refuses, before submitting, a task whose pieces overlap what another task
//! of the same launch writes (or what it writes overlaps another's reads), with an
//! [`ErrorKind::Overlap`] error. `task_graph!` loops prove the same at compile time.

use crate::data::task_args::TaskHandle;
use crate::data::tensor::Tensor;
use crate::dsl::place::{Call, Placement, kind::Kind};
use crate::engine::orchestrator::Orchestrator;
use crate::error::{Error, ErrorKind, Result};

/// One tensor argument of a task of the launch.
struct Piece {
    tensor: Tensor,
    writes: bool,
    /// The callable's parameter.
    param: &'static str,
}

/// One task of the launch.
struct Launched {
    callable: &'static str,
    pieces: Vec<Piece>,
}

/// An index launch: tasks meant to run in parallel over distinct pieces of tensors (typically
/// the pieces of [`TensorOf::split`](crate::dsl::TensorOf::split) or
/// [`tiles`](crate::dsl::TensorOf::tiles)), made with [`Orchestrator::index_launch`].
///
/// [`submit`](IndexLaunch::submit) checks the call against every earlier task of the launch:
/// when one writes bytes the other reads or writes (same buffer, overlapping views), it is
/// refused with an [`ErrorKind::Overlap`] error naming both tasks, their callables, the
/// arguments and the byte ranges, and nothing is submitted. Reads shared by several tasks (a
/// weight every tile reads) are fine. Combine the pieces after the launch (a task that reads
/// the whole tensor waits for every piece's writer).
///
/// ```
/// use simpler::{callable, dsl::sub, ErrorKind, dsl::In, Orchestrator, dsl::Out, Worker};
///
/// #[callable(sub)]
/// fn double(x: In<f32>, mut y: Out<f32>) {
///     for (o, i) in y.iter_mut().zip(x.iter()) {
///         *o = 2.0 * i;
///     }
/// }
///
/// /// `y = 2x`, one task per tile; the tile count is a run-time value.
/// #[callable(orch)]
/// fn double_tiles(o: &mut Orchestrator<'_>, x: In<f32>, y: Out<f32>, tiles: u32) -> simpler::Result<()> {
///     let (xs, mut ys) = (x.split(tiles)?, y.split(tiles)?);
///     let mut launch = o.index_launch();
///     for (xt, yt) in xs.iter().zip(ys.iter_mut()) {
///         launch.submit(double::call(xt, yt)?, sub())?;
///     }
///     Ok(())
/// }
///
/// /// The same with every task writing the whole of `y`: refused before anything runs.
/// #[callable(orch)]
/// fn racy(o: &mut Orchestrator<'_>, x: In<f32>, y: Out<f32>, tiles: u32) -> simpler::Result<()> {
///     let xs = x.split(tiles)?;
///     let mut launch = o.index_launch();
///     for xt in &xs {
///         let mut whole = y.share();
///         launch.submit(double::call(xt, &mut whole.rows(0..xt.shape()[0])?)?, sub())?;
///     }
///     Ok(())
/// }
///
/// # fn main() -> simpler::Result<()> {
/// let mut worker = Worker::builder().sub_workers(2).build()?;
/// worker.init()?;
/// let (a, b) = (worker.create_buffer(4 * 64)?, worker.create_buffer(4 * 64)?);
/// a.write(0, &[1.5f32; 64])?;
/// let (x, mut y) = (a.typed::<f32>(&[64])?, b.typed::<f32>(&[64])?);
/// double_tiles::call(&x, &mut y, 8)?.run(&worker)?;
/// assert_eq!(b.read::<f32>(0, 64)?, vec![3.0; 64]);
/// let err = racy::call(&x, &mut y, 8)?.run(&worker).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::Overlap);
/// assert!(err.message().contains("task 1 of the index launch"), "{err}");
/// worker.close()
/// # }
/// ```
pub struct IndexLaunch<'l, 'o> {
    orch: &'l mut Orchestrator<'o>,
    tasks: Vec<Launched>,
}

impl<'o> Orchestrator<'o> {
    /// Starts an [`IndexLaunch`]: typed calls submitted through it are checked to touch
    /// disjoint pieces of what they write.
    ///
    /// ```no_run
    /// # fn demo(o: &mut simpler::Orchestrator<'_>) {
    /// let launch = o.index_launch();
    /// assert!(launch.is_empty());
    /// # }
    /// ```
    pub fn index_launch(&mut self) -> IndexLaunch<'_, 'o> {
        IndexLaunch { orch: self, tasks: Vec::new() }
    }
}

impl IndexLaunch<'_, '_> {
    /// Submits one task of the launch at `place`, as [`Call::on`] does, after checking it
    /// against the launch's earlier tasks.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Overlap`] when a tensor this call writes overlaps one an earlier task of
    /// the launch reads or writes, or one it reads overlaps one an earlier task writes; then
    /// the errors of [`Call::on`].
    ///
    /// ```no_run
    /// # use simpler::{callable, dsl::sub, dsl::In, dsl::Out, dsl::TensorOf};
    /// # #[callable(sub)]
    /// # fn copy(a: In<f32>, mut b: Out<f32>) { b.copy_from_slice(&a); }
    /// # fn demo(o: &mut simpler::Orchestrator<'_>, x: &TensorOf<f32>, y: &TensorOf<f32>) -> simpler::Result<()> {
    /// let mut launch = o.index_launch();
    /// for (xt, mut yt) in x.split(4)?.iter().zip(y.split(4)?) {
    ///     launch.submit(copy::call(xt, &mut yt)?, sub())?;
    /// }
    /// assert_eq!(launch.len(), 4);
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn submit<K: Kind>(&mut self, call: Call<K>, place: impl Placement<K>) -> Result<TaskHandle> {
        let args = call.args();
        let pieces: Vec<Piece> = args
            .tensors()
            .iter()
            .enumerate()
            .map(|(arg, t)| Piece {
                tensor: t.clone(),
                writes: args.tag(arg).is_some_and(|g| g.writes()),
                param: call.tensor_param(arg),
            })
            .collect();
        let me = self.tasks.len();
        for (other, earlier) in self.tasks.iter().enumerate() {
            for p in &pieces {
                for q in &earlier.pieces {
                    if (p.writes || q.writes) && p.tensor.overlaps(&q.tensor) {
                        let verb = |w: bool| if w { "writes" } else { "reads" };
                        let range = |t: &Tensor| {
                            let (a, b) = t.view().byte_range();
                            format!("bytes {a}..{b} of buffer {}", t.desc().identity())
                        };
                        return Err(Error::new(
                            ErrorKind::Overlap,
                            format!(
                                "task {me} of the index launch (`{}` parameter `{}`) {} {}, which overlaps what task {other} (`{}` parameter `{}`) {} ({}); the tasks of an index launch must touch disjoint pieces of what they write: give each task its own piece (`split`, `tiles`, `grid`), or combine the results after the launch",
                                call.name(),
                                p.param,
                                verb(p.writes),
                                range(&p.tensor),
                                earlier.callable,
                                q.param,
                                verb(q.writes),
                                range(&q.tensor),
                            ),
                        ));
                    }
                }
            }
        }
        let callable = call.name();
        let handle = call.on(self.orch, place)?;
        self.tasks.push(Launched { callable, pieces });
        Ok(handle)
    }

    /// How many tasks the launch has submitted.
    ///
    /// ```no_run
    /// # fn demo(o: &mut simpler::Orchestrator<'_>) {
    /// assert_eq!(o.index_launch().len(), 0);
    /// # }
    /// ```
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the launch has submitted nothing yet.
    ///
    /// ```no_run
    /// # fn demo(o: &mut simpler::Orchestrator<'_>) {
    /// assert!(o.index_launch().is_empty());
    /// # }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}
