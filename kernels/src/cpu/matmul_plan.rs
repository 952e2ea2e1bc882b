//! How one `matmul_many` job's products split into pool tasks.
//!
//! The repacked groups of every product in the job are cut as one
//! sequence, largest pieces first ([`ThreadPool::guided_ranges`]): a job of
//! Q, K and V (or gate and up) has one tail of small pieces at its end,
//! not one per product, and a piece may run from the end of one product
//! into the next. At one activation row (single-stream decode) a task is a
//! few microseconds of weights, so each claim (an atomic shared by both
//! cores) and each cold start of a task's stream showed: SmolLM2's Q, K
//! and V took 13 tasks and gate and up 14, now 6 and 8 on two threads.
//! Which task computes a group changes no result: every group's outputs
//! are the same sums whoever runs them.

use std::ops::Range;

use super::packed::GROUP_ROWS;
use super::threads::ThreadPool;

/// Tasks come from [`ThreadPool::guided_ranges`]: a few large ones first,
/// then smaller ones that even out the threads' finishing times. Sixteen
/// equal small tasks per thread (the first design, so that a preempted
/// worker held back little) measured 7% slower at batch 1 and 16 on two
/// threads (14% at batch 4, 17% on the AVX2 per-row path) in paired runs,
/// and no faster on one thread: with small tasks the threads take turns
/// along a matrix, so neither reads its weights as one sequential stream.
/// A preempted worker now holds back up to half a matrix, against the
/// scheduler's time slice it lost.
pub(crate) const MIN_ROWS_PER_TASK: usize = 8;
/// A group is 16 rows; two make a task worth its atomic.
const MIN_GROUPS_PER_TASK: usize = 2;
/// At most this many groups (1,024 rows) per task, so that the first tasks
/// of the 49,152-row output matrix do not hold half of it each.
const MAX_GROUPS_PER_TASK: usize = 64;
pub(crate) const MAX_ROWS_PER_TASK: usize = MAX_GROUPS_PER_TASK * GROUP_ROWS;

/// What the plan needs to know of one product.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// 16-row groups the group kernels take (0 where not repacked).
    pub(crate) groups: usize,
    /// Output rows; those past `groups * GROUP_ROWS` take the per-row kernels.
    pub(crate) rows: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    /// 16-row groups of a repacked matrix.
    Groups(Range<usize>),
    /// Weight rows in the checkpoint's layout.
    Rows(Range<usize>),
}

/// Part of one product's work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) target: usize,
    pub(crate) unit: Unit,
}

/// The job's tasks: task `i` runs `parts[tasks[i]]`.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) parts: Vec<Part>,
    pub(crate) tasks: Vec<Range<usize>>,
}

impl Plan {
    pub(crate) fn task(&self, i: usize) -> &[Part] {
        self.tasks
            .get(i)
            .and_then(|r| self.parts.get(r.clone()))
            .unwrap_or(&[])
    }
}

/// Every product's groups, cut as one sequence, then each product's rows
/// that no group covers, cut product by product.
pub(crate) fn plan(pool: &ThreadPool, shapes: &[Shape]) -> Plan {
    let mut plan = Plan::default();
    let total: usize = shapes.iter().map(|s| s.groups).sum();
    for piece in pool.guided_ranges(0..total, MIN_GROUPS_PER_TASK, MAX_GROUPS_PER_TASK) {
        let first = plan.parts.len();
        // The products' groups in order: product `i` holds the flat
        // indices `base..base + groups`.
        let mut base = 0;
        for (target, shape) in shapes.iter().enumerate() {
            let (start, end) = (piece.start.max(base), piece.end.min(base + shape.groups));
            if start < end {
                plan.parts.push(Part {
                    target,
                    unit: Unit::Groups(start - base..end - base),
                });
            }
            base += shape.groups;
        }
        plan.tasks.push(first..plan.parts.len());
    }
    for (target, shape) in shapes.iter().enumerate() {
        let first_row = shape.groups * GROUP_ROWS;
        let rows = pool.guided_ranges(first_row..shape.rows, MIN_ROWS_PER_TASK, MAX_ROWS_PER_TASK);
        for r in rows {
            plan.tasks.push(plan.parts.len()..plan.parts.len() + 1);
            plan.parts.push(Part {
                target,
                unit: Unit::Rows(r),
            });
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every group and row of every product exactly once, in tasks of at
    /// most the cap.
    fn check_cover(plan: &Plan, shapes: &[Shape]) {
        let mut groups: Vec<Vec<u32>> = shapes.iter().map(|s| vec![0; s.groups]).collect();
        let mut rows: Vec<Vec<u32>> = shapes.iter().map(|s| vec![0; s.rows]).collect();
        for i in 0..plan.tasks.len() {
            let mut task_groups = 0;
            for part in plan.task(i) {
                match &part.unit {
                    Unit::Groups(r) => {
                        task_groups += r.len();
                        r.clone().for_each(|g| groups[part.target][g] += 1);
                    }
                    Unit::Rows(r) => {
                        assert!(r.start >= shapes[part.target].groups * GROUP_ROWS);
                        r.clone().for_each(|row| rows[part.target][row] += 1);
                    }
                }
            }
            assert!(
                task_groups <= MAX_GROUPS_PER_TASK,
                "task {i}: {task_groups} groups"
            );
        }
        for (t, s) in shapes.iter().enumerate() {
            assert!(groups[t].iter().all(|&c| c == 1), "product {t}'s groups");
            let tail = &rows[t][s.groups * GROUP_ROWS..];
            assert!(tail.iter().all(|&c| c == 1), "product {t}'s rows");
        }
    }

    #[test]
    fn every_group_and_row_once() {
        for threads in 1..=3 {
            let pool = ThreadPool::new(threads);
            for shapes in [
                vec![],
                vec![Shape { groups: 0, rows: 0 }],
                vec![Shape {
                    groups: 0,
                    rows: 100,
                }],
                vec![Shape {
                    groups: 36,
                    rows: 576,
                }],
                vec![
                    Shape {
                        groups: 36,
                        rows: 580,
                    },
                    Shape { groups: 0, rows: 7 },
                ],
                vec![
                    Shape {
                        groups: 36,
                        rows: 576,
                    },
                    Shape {
                        groups: 12,
                        rows: 192,
                    },
                    Shape {
                        groups: 12,
                        rows: 192,
                    },
                ],
                vec![Shape {
                    groups: 3072,
                    rows: 49_152,
                }],
                vec![
                    Shape {
                        groups: 1,
                        rows: 16,
                    },
                    Shape {
                        groups: 1,
                        rows: 16,
                    },
                ],
            ] {
                check_cover(&plan(&pool, &shapes), &shapes);
            }
        }
    }

    #[test]
    fn products_sharing_a_job_share_one_tail() {
        let pool = ThreadPool::new(2);
        // SmolLM2's Q, K and V: 60 groups as one sequence.
        let qkv = [
            Shape {
                groups: 36,
                rows: 576,
            },
            Shape {
                groups: 12,
                rows: 192,
            },
            Shape {
                groups: 12,
                rows: 192,
            },
        ];
        let p = plan(&pool, &qkv);
        let sizes: Vec<usize> = (0..p.tasks.len())
            .map(|i| {
                p.task(i)
                    .iter()
                    .map(|part| match &part.unit {
                        Unit::Groups(r) => r.len(),
                        Unit::Rows(_) => 0,
                    })
                    .sum()
            })
            .collect();
        assert_eq!(sizes, [30, 15, 8, 4, 2, 1]);
        // The second task runs from Q's end into K.
        assert_eq!(
            p.task(1),
            [
                Part {
                    target: 0,
                    unit: Unit::Groups(30..36)
                },
                Part {
                    target: 1,
                    unit: Unit::Groups(0..9)
                },
            ]
        );
        // Gate and up: 192 groups in 8 tasks (each alone took 7).
        let gate_up = [Shape {
            groups: 96,
            rows: 1536,
        }; 2];
        assert_eq!(plan(&pool, &gate_up).tasks.len(), 8);
    }
}
