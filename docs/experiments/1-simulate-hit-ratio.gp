set terminal pngcairo size 960,600 noenhanced
set output 'docs/experiments/1-simulate-hit-ratio.png'
set title 'Hit ratio against store budget'
set xlabel 'store budget (GiB)'
set ylabel 'token hit ratio'
set yrange [0:*]
set offsets 0, 0, graph 0.05, 0
set grid
set key outside right
set logscale x 2
set xrange [0.6666666667:192]
set xtics add ('unlimited' 128)
$g0 << EOD
1 0.02461392526
4 0.08725158032
16 0.2554598093
64 0.5476621902
EOD
$u0 << EOD
128 0.6504497748
EOD
$g1 << EOD
1 0.02461392526
4 0.08725158032
16 0.2554598093
64 0.5476621902
EOD
$u1 << EOD
128 0.6504497748
EOD
$g2 << EOD
1 0.02461392526
4 0.08725158032
16 0.2554598093
64 0.5476621902
EOD
$u2 << EOD
128 0.6504497748
EOD
$g3 << EOD
1 0.0243932523
4 0.08633228394
16 0.2529675644
64 0.5427749638
EOD
$u3 << EOD
128 0.6448210454
EOD
plot $g0 using 1:2 with linespoints pt 7 lc 1 title 'B=64 K=134 ring', \
     $u0 using 1:2 with points pt 9 ps 1.5 lc 1 notitle, \
     $g1 using 1:2 with linespoints pt 7 lc 2 title 'B=64 K=134 keep', \
     $u1 using 1:2 with points pt 9 ps 1.5 lc 2 notitle, \
     $g2 using 1:2 with linespoints pt 7 lc 3 title 'B=64 K=512 ring', \
     $u2 using 1:2 with points pt 9 ps 1.5 lc 3 notitle, \
     $g3 using 1:2 with linespoints pt 7 lc 4 title 'B=64 K=512 keep', \
     $u3 using 1:2 with points pt 9 ps 1.5 lc 4 notitle
set output
