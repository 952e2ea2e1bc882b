//! `switchyard`: the command-line program.

fn main() {
    println!("switchyard");
}
