//! `sqlx::migrate!` embeds the migrations at compile time: rebuild when
//! they change, or a new migration would be left out of the binary.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
